//! [`DeviceService`]: a device's runtime behind the Arrow Flight service.
//!
//! ```text
//!   host ──handshake(token)──────────▶ capabilities
//!        ──do_get(envelope)─────────▶ Device::execute ─▶ IPC chunks ─▶ FlightData
//!        ◀──schema, batches…, stats──   (bounded channel: HTTP/2 flow control
//!                                        reaches back to the device's operators)
//!        ──do_put(cmd, batches, commit)▶ PartitionWriter (temp file, fsync,
//!                                        rename) ─▶ manifest update
//!        ──do_action(list_tables | stats | read_range | drop_table | capabilities)
//! ```
//!
//! Every call is authorized first: with a token configured, a call without
//! `authorization: Bearer <token>` is rejected with `Unauthenticated`.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;
use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use insitu_client::{batch_to_ipc, DeviceMessage};
use insitu_device::{Device, DeviceError, DeviceErrorKind};
use insitu_format::{PartitionLayout, WriterOptions};
use insitu_wire::protocol::{
    action, from_json_bytes, to_json_bytes, DropTableRequest, ReadRangeRequest, RANGE_CHUNK_BYTES,
};
use insitu_wire::{
    DeviceStats, PutCommit, PutRequest, SampleKeysRequest, SortTableRequest, PROTOCOL_VERSION,
};
use tonic::{Request, Response, Status, Streaming};

use crate::split::ipc_chunk_to_flight;

/// Batches of an upload buffered ahead of the partition writer.
const PUT_BATCHES_IN_FLIGHT: usize = 4;

/// Counters the Flight layer adds to the device's own.
#[derive(Debug, Default)]
pub struct ServerCounters {
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    pub calls_unauthenticated: AtomicU64,
    pub puts_rejected: AtomicU64,
}

/// What the service shares with the metrics endpoint.
#[derive(Debug)]
pub struct ServerState {
    pub device: Arc<Device>,
    pub counters: ServerCounters,
    token: Option<String>,
}

impl ServerState {
    pub fn new(device: Arc<Device>, token: Option<String>) -> Arc<Self> {
        Arc::new(Self {
            device,
            counters: ServerCounters::default(),
            token,
        })
    }

    /// The device's counters plus the bytes this server moved.
    pub fn stats(&self) -> DeviceStats {
        let mut stats = self.device.stats();
        stats.bytes_sent = self.counters.bytes_sent.load(Ordering::Relaxed);
        stats.bytes_received = self.counters.bytes_received.load(Ordering::Relaxed);
        stats.process_rss_bytes = insitu_extsort::rss::current_rss_bytes();
        stats.process_rss_peak_bytes = insitu_extsort::rss::peak_rss_bytes();
        stats
    }

    fn id(&self) -> u32 {
        self.device.id()
    }

    fn sent(&self, n: usize) {
        self.counters
            .bytes_sent
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    fn received(&self, n: usize) {
        self.counters
            .bytes_received
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Checks the bearer token of a call.
    fn authorize<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        let presented = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match presented {
            Some(p) if constant_time_eq(p.as_bytes(), token.as_bytes()) => Ok(()),
            Some(_) => Err(self.unauthenticated("wrong bearer token")),
            None => Err(self.unauthenticated("missing bearer token")),
        }
    }

    fn unauthenticated(&self, why: &str) -> Status {
        self.counters
            .calls_unauthenticated
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(device = self.id(), "rejected call: {why}");
        Status::unauthenticated(format!("device {}: {why}", self.id()))
    }
}

/// Compares without an early exit, so timing does not reveal the prefix
/// a guess got right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Maps a device error to the gRPC status a client sees; the message keeps
/// the device's name.
pub fn status_of(e: DeviceError) -> Status {
    let message = e.to_string();
    match e.kind {
        DeviceErrorKind::NotFound => Status::not_found(message),
        DeviceErrorKind::Corrupt => Status::data_loss(message),
        DeviceErrorKind::BadPlan => Status::invalid_argument(message),
        DeviceErrorKind::ResourcesExhausted => Status::resource_exhausted(message),
        DeviceErrorKind::Cancelled => Status::cancelled(message),
        DeviceErrorKind::Config => Status::failed_precondition(message),
        DeviceErrorKind::Execution => Status::internal(message),
    }
}

/// The Flight service of one device.
#[derive(Debug, Clone)]
pub struct DeviceService {
    state: Arc<ServerState>,
}

impl DeviceService {
    pub fn new(state: Arc<ServerState>) -> Self {
        Self { state }
    }

    fn invalid(&self, what: impl std::fmt::Display) -> Status {
        Status::invalid_argument(format!("device {}: {what}", self.state.id()))
    }

    fn one_result(&self, body: Vec<u8>) -> Response<ActionStream> {
        self.state.sent(body.len());
        let item = arrow_flight::Result {
            body: Bytes::from(body),
        };
        Response::new(stream::once(async move { Ok(item) }).boxed())
    }

    async fn read_range(&self, body: &[u8]) -> Result<Response<ActionStream>, Status> {
        let r: ReadRangeRequest =
            from_json_bytes(body, "read_range request").map_err(|e| self.invalid(e))?;
        let bytes = self
            .state
            .device
            .read_range(&r.table, r.partition, r.start..r.end)
            .await
            .map_err(status_of)?;
        self.state.sent(bytes.len());
        let chunks: Vec<Result<arrow_flight::Result, Status>> = (0..bytes.len())
            .step_by(RANGE_CHUNK_BYTES)
            .map(|at| {
                let end = (at + RANGE_CHUNK_BYTES).min(bytes.len());
                Ok(arrow_flight::Result {
                    body: bytes.slice(at..end),
                })
            })
            .collect();
        Ok(Response::new(stream::iter(chunks).boxed()))
    }

    async fn sample_keys(&self, body: Vec<u8>) -> Result<Response<ActionStream>, Status> {
        let r: SampleKeysRequest =
            from_json_bytes(&body, "sample_keys request").map_err(|e| self.invalid(e))?;
        let device = Arc::clone(&self.state.device);
        let id = self.state.id();
        let bytes = tokio::task::spawn_blocking(move || {
            let sample = device.sample_keys(&r).map_err(status_of)?;
            batch_to_ipc(&sample)
                .map_err(|e| Status::internal(format!("device {id}: key sample: {e}")))
        })
        .await
        .map_err(|e| Status::internal(format!("device {id}: sample task failed: {e}")))??;
        Ok(self.one_result(bytes))
    }

    async fn sort_table(&self, body: Vec<u8>) -> Result<Response<ActionStream>, Status> {
        let r: SortTableRequest =
            from_json_bytes(&body, "sort_table request").map_err(|e| self.invalid(e))?;
        if !table_name_ok(&r.into) {
            return Err(self.invalid(format!(
                "table name '{}' must be 1 to 128 letters, digits and underscores",
                r.into
            )));
        }
        let device = Arc::clone(&self.state.device);
        let id = self.state.id();
        let written = tokio::task::spawn_blocking(move || device.sort_table(&r))
            .await
            .map_err(|e| Status::internal(format!("device {id}: sort task failed: {e}")))?
            .map_err(status_of)?;
        tracing::info!(
            device = id,
            partitions = written.len(),
            "sort_table finished"
        );
        Ok(self.one_result(to_json_bytes(&written)))
    }

    fn drop_table(&self, body: &[u8]) -> Result<Response<ActionStream>, Status> {
        let r: DropTableRequest =
            from_json_bytes(body, "drop_table request").map_err(|e| self.invalid(e))?;
        self.state.device.drop_table(&r.table).map_err(status_of)?;
        tracing::info!(device = self.state.id(), table = %r.table, "dropped table");
        Ok(Response::new(stream::empty().boxed()))
    }
}

type ActionStream = BoxStream<'static, Result<arrow_flight::Result, Status>>;
type DataStream = BoxStream<'static, Result<FlightData, Status>>;

/// Turns one device message into the Flight messages that carry it.
fn flight_messages(
    msg: insitu_device::DeviceResult<DeviceMessage>,
    device: u32,
) -> Vec<Result<FlightData, Status>> {
    match msg {
        Ok(DeviceMessage::Ipc(chunk)) => match ipc_chunk_to_flight(&chunk) {
            Ok(messages) => messages.into_iter().map(Ok).collect(),
            Err(e) => vec![Err(Status::internal(format!(
                "device {device}: cannot frame result chunk: {e}"
            )))],
        },
        Ok(DeviceMessage::Done(stats)) => vec![Ok(FlightData {
            app_metadata: Bytes::from(to_json_bytes(&stats)),
            ..Default::default()
        })],
        Ok(DeviceMessage::Batch(_)) => vec![Err(Status::internal(format!(
            "device {device}: produced a decoded batch where IPC was expected"
        )))],
        Err(e) => vec![Err(status_of(e))],
    }
}

#[tonic::async_trait]
impl FlightService for DeviceService {
    type HandshakeStream = BoxStream<'static, Result<HandshakeResponse, Status>>;
    type ListFlightsStream = BoxStream<'static, Result<FlightInfo, Status>>;
    type DoGetStream = DataStream;
    type DoPutStream = BoxStream<'static, Result<PutResult, Status>>;
    type DoActionStream = ActionStream;
    type ListActionsStream = BoxStream<'static, Result<ActionType, Status>>;
    type DoExchangeStream = DataStream;

    /// Checks the token in the first request's payload (or the header) and
    /// answers with the device's capabilities.
    async fn handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        let header_ok = self.state.authorize(&request).is_ok();
        let mut incoming = request.into_inner();
        let first = incoming.message().await?.unwrap_or_default();
        if !header_ok {
            let presented = std::str::from_utf8(&first.payload).unwrap_or("");
            match &self.state.token {
                Some(t) if constant_time_eq(presented.as_bytes(), t.as_bytes()) => {}
                _ => return Err(self.state.unauthenticated("handshake with a wrong token")),
            }
        }
        let payload = to_json_bytes(&self.state.device.capabilities());
        let response = HandshakeResponse {
            protocol_version: PROTOCOL_VERSION as u64,
            payload: Bytes::from(payload),
        };
        Ok(Response::new(
            stream::once(async move { Ok(response) }).boxed(),
        ))
    }

    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        self.state.authorize(&request)?;
        Err(Status::unimplemented(
            "list_flights: use the list_tables action",
        ))
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        self.state.authorize(&request)?;
        Err(Status::unimplemented(
            "get_flight_info: send a stage plan envelope to do_get",
        ))
    }

    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        self.state.authorize(&request)?;
        Err(Status::unimplemented("poll_flight_info"))
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        self.state.authorize(&request)?;
        Err(Status::unimplemented(
            "get_schema: use the list_tables action",
        ))
    }

    /// Runs the stage plan envelope in the ticket; answers with its results
    /// as a Flight stream, then one data-less message carrying the stage's
    /// statistics. Dropping the call cancels the stage on the device.
    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        self.state.authorize(&request)?;
        let envelope = request.into_inner().ticket;
        self.state.received(envelope.len());
        let rx = self.state.device.execute(&envelope).map_err(status_of)?;
        let state = Arc::clone(&self.state);
        let device = state.id();
        let messages = stream::unfold(rx, |mut rx| async move {
            let msg = rx.recv().await?;
            Some((msg, rx))
        })
        .flat_map(move |msg| stream::iter(flight_messages(msg, device)))
        .inspect(move |m| {
            if let Ok(m) = m {
                state.sent(m.data_header.len() + m.data_body.len() + m.app_metadata.len());
            }
        });
        Ok(Response::new(messages.boxed()))
    }

    /// Ingests one partition: batches, then a [`PutCommit`]. The partition
    /// is written to a temporary file and published (rename, manifest
    /// update) only if the upload is complete and its checksum matches.
    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        self.state.authorize(&request)?;
        let result = put_partition(Arc::clone(&self.state), request.into_inner()).await;
        if result.is_err() {
            self.state
                .counters
                .puts_rejected
                .fetch_add(1, Ordering::Relaxed);
        }
        let descriptor = result?;
        let body = Bytes::from(to_json_bytes(&descriptor));
        let item = PutResult { app_metadata: body };
        Ok(Response::new(stream::once(async move { Ok(item) }).boxed()))
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        self.state.authorize(&request)?;
        let action = request.into_inner();
        self.state.received(action.body.len());
        match action.r#type.as_str() {
            action::CAPABILITIES => {
                Ok(self.one_result(to_json_bytes(&self.state.device.capabilities())))
            }
            action::LIST_TABLES => Ok(self.one_result(self.state.device.manifest().to_json())),
            action::STATS => Ok(self.one_result(to_json_bytes(&self.state.stats()))),
            action::READ_RANGE => self.read_range(&action.body).await,
            action::DROP_TABLE => self.drop_table(&action.body),
            action::SAMPLE_KEYS => self.sample_keys(action.body.to_vec()).await,
            action::SORT_TABLE => self.sort_table(action.body.to_vec()).await,
            other => Err(self.invalid(format!(
                "unknown action '{other}' (known: {})",
                ACTIONS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        self.state.authorize(&request)?;
        let list = ACTIONS.iter().map(|(name, description)| {
            Ok(ActionType {
                r#type: name.to_string(),
                description: description.to_string(),
            })
        });
        Ok(Response::new(
            stream::iter(list.collect::<Vec<_>>()).boxed(),
        ))
    }

    async fn do_exchange(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        self.state.authorize(&request)?;
        Err(Status::unimplemented("do_exchange"))
    }
}

const ACTIONS: [(&str, &str); 7] = [
    (
        action::CAPABILITIES,
        "protocol version, operators, types, layouts, encodings",
    ),
    (
        action::LIST_TABLES,
        "the device manifest: tables, partitions, format descriptors",
    ),
    (action::STATS, "device counters since start"),
    (action::READ_RANGE, "bytes of a partition file (pull mode)"),
    (
        action::DROP_TABLE,
        "remove a table from the manifest, then its files",
    ),
    (
        action::SAMPLE_KEYS,
        "evenly spaced rows of a table's key columns (sort jobs)",
    ),
    (
        action::SORT_TABLE,
        "sort this device's partitions of a table into a new table (sort jobs)",
    ),
];

/// What an upload claimed and what arrived.
#[derive(Debug, Default)]
struct UploadCheck {
    crc: crc32fast::Hasher,
    messages: u64,
    commit: Option<PutCommit>,
    error: Option<String>,
}

fn table_name_ok(table: &str) -> bool {
    !table.is_empty()
        && table.len() <= 128
        && table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

async fn put_partition(
    state: Arc<ServerState>,
    mut incoming: Streaming<FlightData>,
) -> Result<insitu_wire::FormatDescriptor, Status> {
    let id = state.id();
    let invalid = |what: String| Status::invalid_argument(format!("device {id}: {what}"));
    let first = incoming
        .message()
        .await?
        .ok_or_else(|| invalid("do_put: empty upload".into()))?;
    let cmd = first
        .flight_descriptor
        .as_ref()
        .map(|d| d.cmd.clone())
        .ok_or_else(|| invalid("do_put: the first message has no descriptor".into()))?;
    let put: PutRequest =
        from_json_bytes(&cmd, "do_put descriptor").map_err(|e| invalid(e.to_string()))?;
    if !table_name_ok(&put.table) {
        return Err(invalid(format!(
            "table name '{}' must be 1 to 128 letters, digits and underscores",
            put.table
        )));
    }
    let what = format!("table {} partition {}", put.table, put.partition);
    let check = Arc::new(Mutex::new(UploadCheck::default()));
    let checked = checked_upload(Arc::clone(&state), first, incoming, Arc::clone(&check));
    let mut decoder = FlightDataDecoder::new(checked);
    let (tx, rx) =
        tokio::sync::mpsc::channel::<Result<RecordBatch, ArrowError>>(PUT_BATCHES_IN_FLIGHT);
    let mut rx = Some(rx);
    let mut writer = None;
    let mut rows = 0u64;
    let mut failure: Option<String> = None;
    while let Some(decoded) = decoder.next().await {
        match decoded {
            Ok(d) => match d.payload {
                DecodedPayload::Schema(schema) if writer.is_none() => {
                    let device = Arc::clone(&state.device);
                    let (table, partition) = (put.table.clone(), put.partition);
                    let layout = match put.hybrid_key_columns.is_empty() {
                        true => PartitionLayout::Parquet,
                        false => PartitionLayout::Hybrid {
                            key_columns: put.hybrid_key_columns.clone(),
                        },
                    };
                    let options = WriterOptions {
                        row_group_rows_max: put.row_group_rows_max.clamp(1, 1 << 24) as usize,
                        layout,
                        partitioning: put.partitioning.clone(),
                        ..Default::default()
                    };
                    let mut rx = rx.take().expect("one writer per upload");
                    writer = Some(tokio::task::spawn_blocking(move || {
                        let batches = std::iter::from_fn(|| rx.blocking_recv());
                        device.write_partition(&table, partition, schema, batches, &options)
                    }));
                }
                DecodedPayload::Schema(_) => {
                    failure = Some("a second schema arrived".into());
                    break;
                }
                DecodedPayload::RecordBatch(batch) => {
                    rows += batch.num_rows() as u64;
                    if writer.is_none() {
                        failure = Some("a batch arrived before the schema".into());
                        break;
                    }
                    if tx.send(Ok(batch)).await.is_err() {
                        break; // the writer failed; its error is reported below
                    }
                }
                DecodedPayload::None => {}
            },
            Err(e) => {
                failure = Some(e.to_string());
                break;
            }
        }
    }
    let failure = failure.or_else(|| verify_upload(&check, rows));
    if let Some(why) = &failure {
        let _ = tx
            .send(Err(ArrowError::ExternalError(why.clone().into())))
            .await;
    }
    drop(tx);
    let written = match writer {
        Some(w) => Some(
            w.await
                .map_err(|e| Status::internal(format!("device {id}: writer task: {e}")))?,
        ),
        None => None,
    };
    if let Some(why) = failure {
        tracing::warn!(device = id, "rejected upload of {what}: {why}");
        return Err(Status::data_loss(format!(
            "device {id}: upload of {what} rejected, nothing was written: {why}"
        )));
    }
    let descriptor = written
        .ok_or_else(|| invalid(format!("upload of {what} carried no schema")))?
        .map_err(status_of)?;
    tracing::info!(device = id, rows, "ingested {what}");
    Ok(descriptor)
}

/// The upload's messages with the commit message taken out; checksums and
/// counts everything else on the way.
fn checked_upload(
    state: Arc<ServerState>,
    first: FlightData,
    rest: Streaming<FlightData>,
    check: Arc<Mutex<UploadCheck>>,
) -> Pin<Box<dyn futures::Stream<Item = Result<FlightData, FlightError>> + Send>> {
    stream::once(async move { Ok(first) })
        .chain(rest)
        .filter_map(move |m| {
            let state = Arc::clone(&state);
            let check = Arc::clone(&check);
            async move {
                let mut c = check.lock().expect("upload check");
                let m = match m {
                    Ok(m) => m,
                    Err(status) => {
                        c.error = Some(format!("the upload broke off: {}", status.message()));
                        return Some(Err(FlightError::Tonic(Box::new(status))));
                    }
                };
                state.received(m.data_header.len() + m.data_body.len() + m.app_metadata.len());
                if c.commit.is_some() {
                    c.error = Some("data after the commit message".into());
                    return None;
                }
                if m.data_header.is_empty() {
                    match from_json_bytes::<PutCommit>(&m.app_metadata, "put commit") {
                        Ok(commit) => c.commit = Some(commit),
                        Err(e) => c.error = Some(e.to_string()),
                    }
                    return None;
                }
                c.crc.update(&m.data_header);
                c.crc.update(&m.data_body);
                c.messages += 1;
                Some(Ok(m))
            }
        })
        .boxed()
}

/// Why a finished upload must not be published, if it must not.
fn verify_upload(check: &Mutex<UploadCheck>, rows: u64) -> Option<String> {
    let c = check.lock().expect("upload check");
    if let Some(e) = &c.error {
        return Some(e.clone());
    }
    let Some(commit) = c.commit else {
        return Some("the upload ended without its commit message (cut off?)".into());
    };
    let crc = c.crc.clone().finalize();
    if commit.messages != c.messages || commit.crc32 != crc || commit.rows != rows {
        return Some(format!(
            "the commit claims {} messages, {} rows, crc32 {:08x}; received {} messages, \
             {rows} rows, crc32 {crc:08x}",
            commit.messages, commit.rows, commit.crc32, c.messages
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison_needs_the_whole_token() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    #[test]
    fn table_names_are_checked() {
        assert!(table_name_ok("lineitem_2"));
        assert!(!table_name_ok(""));
        assert!(!table_name_ok("../etc"));
        assert!(!table_name_ok(&"x".repeat(129)));
    }

    #[test]
    fn device_errors_keep_their_kind_as_grpc_codes() {
        let e = DeviceError::new(3, DeviceErrorKind::BadPlan, "garbage");
        let s = status_of(e);
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert_eq!(s.message(), "device 3: garbage");
        let e = DeviceError::new(1, DeviceErrorKind::ResourcesExhausted, "mem");
        assert_eq!(status_of(e).code(), tonic::Code::ResourceExhausted);
    }
}
