//! [`FlightDeviceClient`]: the host's handle on a device server.
//!
//! It implements the host's [`DeviceClient`] (stage plans out, decoded
//! batches and statistics back) and ingest's [`PartitionSink`] (uploads
//! with a checksummed commit). Every call has a deadline; dropping a result
//! stream cancels the call, and with it the stage on the device.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use arrow::error::ArrowError;
use arrow::record_batch::RecordBatch;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError as ArrowFlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, FlightData, FlightDescriptor, HandshakeRequest, Ticket};
use async_trait::async_trait;
use bytes::Bytes;
use datafusion::common::{DataFusionError, Result};
use futures::stream::{self, BoxStream, StreamExt};
use insitu_client::DeviceClient;
use insitu_client::{ipc_to_batch, DeviceMessage};
use insitu_format::{PartitionLayout, WriterOptions};
use insitu_host::result_decoder::ResultDecoder;
use insitu_ingest::{BatchSource, IngestError, IngestResult, PartitionSink};
use insitu_link::{Direction, Link};
use insitu_wire::protocol::{
    action, from_json_bytes, manifest_from_json_bytes, to_json_bytes, DropTableRequest,
    ReadRangeRequest, GRPC_MESSAGE_BYTES_MAX,
};
use insitu_wire::{
    Capabilities, DeviceStats, FormatDescriptor, Manifest, PutCommit, PutRequest,
    SampleKeysRequest, SortTableRequest, StageStats, PROTOCOL_VERSION,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request, Status};

use crate::error::FlightError;

/// Where a device server is and how to reach it.
#[derive(Debug, Clone)]
pub struct DeviceEndpoint {
    pub id: u32,
    /// `http://host:port`, or `https://host:port` for TLS.
    pub url: String,
    pub token: Option<String>,
    /// PEM certificate of the CA that signed the server's certificate.
    pub tls_ca: Option<Vec<u8>>,
}

/// Deadlines of a client's calls.
#[derive(Debug, Clone, Copy)]
pub struct ClientOptions {
    /// Connecting and handshaking (`connect_timeout_secs`).
    pub connect_timeout: Duration,
    /// Control calls: manifests, stats, ranges, drops (`call_timeout_secs`).
    pub call_timeout: Duration,
    /// A whole stage result stream or upload (`stage_timeout_secs`).
    pub stage_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(60),
            stage_timeout: Duration::from_secs(3600),
        }
    }
}

/// A device server as the host sees it.
pub struct FlightDeviceClient {
    endpoint: DeviceEndpoint,
    channel: Channel,
    capabilities: Capabilities,
    link: Arc<Link>,
    options: ClientOptions,
    storage_bytes: Arc<AtomicU64>,
    handle: tokio::runtime::Handle,
}

impl std::fmt::Debug for FlightDeviceClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FlightDeviceClient({})", self.display_name())
    }
}

/// Whether an error message already starts by naming its device.
fn names_device(message: &str) -> bool {
    message
        .strip_prefix("device ")
        .and_then(|rest| rest.split_once(':'))
        .is_some_and(|(id, _)| id.parse::<u32>().is_ok())
}

impl FlightDeviceClient {
    /// Connects, authenticates and reads the device's capabilities; fails
    /// with an error naming the device if it is down, answers as another
    /// device, or speaks another protocol version.
    pub async fn connect(
        endpoint: DeviceEndpoint,
        link: Arc<Link>,
        options: ClientOptions,
    ) -> std::result::Result<Self, FlightError> {
        let name = format!("device {} at {}", endpoint.id, endpoint.url);
        let fail = |message: String| FlightError::Connect {
            name: name.clone(),
            message,
        };
        let mut ep = Endpoint::from_shared(endpoint.url.clone())
            .map_err(|e| fail(format!("bad endpoint address: {e}")))?
            .connect_timeout(options.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .keep_alive_while_idle(true);
        if endpoint.url.starts_with("https://") {
            let mut tls = ClientTlsConfig::new();
            if let Some(ca) = &endpoint.tls_ca {
                tls = tls.ca_certificate(Certificate::from_pem(ca));
            }
            ep = ep
                .tls_config(tls)
                .map_err(|e| fail(format!("TLS configuration: {e}")))?;
        }
        let channel = ep
            .connect()
            .await
            .map_err(|e| fail(format!("unreachable: {}", error_chain(&e))))?;
        let mut client = Self {
            endpoint,
            channel,
            capabilities: Capabilities {
                protocol_version: PROTOCOL_VERSION,
                device_id: 0,
                operators: vec![],
                data_types: vec![],
                layouts: vec![],
                encodings: vec![],
                mem_bytes_max: 0,
                threads: 0,
                profile: None,
            },
            link,
            options,
            storage_bytes: Arc::new(AtomicU64::new(0)),
            handle: tokio::runtime::Handle::current(),
        };
        client.capabilities = client
            .handshake()
            .await
            .map_err(|e| FlightError::Handshake {
                device: client.endpoint.id,
                message: e.to_string(),
            })?;
        Ok(client)
    }

    fn display_name(&self) -> String {
        format!("device {} at {}", self.endpoint.id, self.endpoint.url)
    }

    pub fn endpoint(&self) -> &DeviceEndpoint {
        &self.endpoint
    }

    fn client(&self) -> FlightServiceClient<Channel> {
        FlightServiceClient::new(self.channel.clone())
            .max_decoding_message_size(GRPC_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(GRPC_MESSAGE_BYTES_MAX)
    }

    fn request<T>(&self, message: T, timeout: Duration) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(timeout);
        if let Some(token) = &self.endpoint.token {
            if let Ok(value) = format!("Bearer {token}").parse() {
                request.metadata_mut().insert("authorization", value);
            }
        }
        request
    }

    /// A gRPC failure as a DataFusion error naming this device.
    fn status_error(&self, status: &Status) -> DataFusionError {
        status_to_error(&self.display_name(), status)
    }

    fn timed_out(&self, what: &str, after: Duration) -> DataFusionError {
        DataFusionError::Execution(format!(
            "{}: {what} exceeded its deadline of {} s",
            self.display_name(),
            after.as_secs_f64()
        ))
    }

    async fn with_deadline<T>(
        &self,
        what: &str,
        after: Duration,
        call: impl std::future::Future<Output = std::result::Result<T, Status>>,
    ) -> Result<T> {
        match tokio::time::timeout(after, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(status)) => Err(self.status_error(&status)),
            Err(_) => Err(self.timed_out(what, after)),
        }
    }

    async fn handshake(&self) -> Result<Capabilities> {
        let payload = Bytes::from(self.endpoint.token.clone().unwrap_or_default());
        let hello = HandshakeRequest {
            protocol_version: PROTOCOL_VERSION as u64,
            payload,
        };
        let timeout = self.options.connect_timeout;
        let request = self.request(stream::once(async move { hello }), timeout);
        let mut client = self.client();
        let first = self
            .with_deadline("handshake", timeout, async move {
                let mut responses = client.handshake(request).await?.into_inner();
                responses.message().await
            })
            .await?
            .ok_or_else(|| self.protocol_error("empty handshake answer"))?;
        let caps: Capabilities =
            from_json_bytes(&first.payload, "capabilities").map_err(|e| self.protocol_error(e))?;
        if caps.protocol_version != PROTOCOL_VERSION {
            return Err(self.protocol_error(format!(
                "speaks protocol version {}, this host speaks {PROTOCOL_VERSION}",
                caps.protocol_version
            )));
        }
        if caps.device_id != self.endpoint.id {
            return Err(self.protocol_error(format!(
                "answers as device {}; the cluster file says {}",
                caps.device_id, self.endpoint.id
            )));
        }
        Ok(caps)
    }

    fn protocol_error(&self, what: impl std::fmt::Display) -> DataFusionError {
        DataFusionError::Execution(format!("{}: {what}", self.display_name()))
    }

    /// Runs an action and concatenates its result bodies.
    async fn action(&self, name: &str, body: Vec<u8>) -> Result<Bytes> {
        self.action_within(name, body, self.options.call_timeout)
            .await
    }

    /// [`Self::action`] with its own deadline (long device jobs).
    async fn action_within(&self, name: &str, body: Vec<u8>, timeout: Duration) -> Result<Bytes> {
        self.link
            .transfer(Direction::HostToDevice, name.len() + body.len())
            .await;
        let request = self.request(
            Action {
                r#type: name.to_string(),
                body: Bytes::from(body),
            },
            timeout,
        );
        let mut client = self.client();
        let link = Arc::clone(&self.link);
        self.with_deadline(name, timeout, async move {
            let mut results = client.do_action(request).await?.into_inner();
            let mut out = Vec::new();
            while let Some(r) = results.message().await? {
                link.transfer(Direction::DeviceToHost, r.body.len()).await;
                out.extend_from_slice(&r.body);
            }
            Ok(Bytes::from(out))
        })
        .await
    }

    /// Runs `f` to completion from synchronous code (ingest threads).
    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.handle.block_on(f)
    }

    async fn put_partition(
        &self,
        request: PutRequest,
        schema: SchemaRef,
        batches: tokio::sync::mpsc::Receiver<std::result::Result<RecordBatch, ArrowFlightError>>,
    ) -> Result<insitu_wire::FormatDescriptor> {
        let descriptor = FlightDescriptor::new_cmd(to_json_bytes(&request));
        let rows = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&rows);
        let batches = stream::unfold(
            batches,
            |mut rx| async move { rx.recv().await.map(|b| (b, rx)) },
        )
        .inspect(move |b| {
            if let Ok(b) = b {
                counted.fetch_add(b.num_rows() as u64, Ordering::Relaxed);
            }
        });
        let encoded = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .with_flight_descriptor(Some(descriptor))
            .build(batches);
        let upload = committed_upload(encoded, rows, Arc::clone(&self.link));
        let timeout = self.options.stage_timeout;
        let request = self.request(upload, timeout);
        let mut client = self.client();
        let answer = self
            .with_deadline("upload", timeout, async move {
                let mut results = client.do_put(request).await?.into_inner();
                results.message().await
            })
            .await?
            .ok_or_else(|| self.protocol_error("upload answered with nothing"))?;
        let descriptor: insitu_wire::FormatDescriptor =
            from_json_bytes(&answer.app_metadata, "put result")
                .map_err(|e| self.protocol_error(e))?;
        Ok(descriptor)
    }
}

/// The encoded upload, each message checksummed, then the [`PutCommit`].
/// An error from the batch source ends the stream without a commit, so the
/// device discards the upload.
fn committed_upload(
    encoded: impl futures::Stream<Item = std::result::Result<FlightData, ArrowFlightError>>
        + Send
        + 'static,
    rows: Arc<AtomicU64>,
    link: Arc<Link>,
) -> impl futures::Stream<Item = FlightData> + Send + 'static {
    struct State<S> {
        encoded: S,
        crc: crc32fast::Hasher,
        messages: u64,
        done: bool,
    }
    let state = State {
        encoded: Box::pin(encoded),
        crc: crc32fast::Hasher::new(),
        messages: 0,
        done: false,
    };
    stream::unfold(state, move |mut st| {
        let rows = Arc::clone(&rows);
        let link = Arc::clone(&link);
        async move {
            if st.done {
                return None;
            }
            let message = match st.encoded.next().await {
                Some(Ok(m)) => {
                    st.crc.update(&m.data_header);
                    st.crc.update(&m.data_body);
                    st.messages += 1;
                    m
                }
                Some(Err(e)) => {
                    tracing::warn!("upload aborted by its source: {e}");
                    return None;
                }
                None => {
                    st.done = true;
                    let commit = PutCommit {
                        rows: rows.load(Ordering::Relaxed),
                        messages: st.messages,
                        crc32: st.crc.clone().finalize(),
                    };
                    FlightData {
                        app_metadata: Bytes::from(to_json_bytes(&commit)),
                        ..Default::default()
                    }
                }
            };
            let size = message.data_header.len() + message.data_body.len();
            link.transfer(Direction::HostToDevice, size + message.app_metadata.len())
                .await;
            Some((message, st))
        }
    })
}

/// A gRPC failure as a DataFusion error naming the device `name`. A
/// message in which the device named itself keeps its text, with `name`
/// (which adds where the device is) in place of the device's own prefix.
fn status_to_error(name: &str, status: &Status) -> DataFusionError {
    let message = status.message();
    let text = if names_device(message) {
        let (_, rest) = message.split_once(':').expect("checked");
        format!("{name}:{rest}")
    } else {
        let what = match status.code() {
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal => {
                "connection lost or refused"
            }
            Code::DeadlineExceeded => "deadline exceeded",
            Code::Unauthenticated => "authentication failed",
            _ => "call failed",
        };
        let source = std::error::Error::source(status)
            .map(|e| format!(" ({})", error_chain(e)))
            .unwrap_or_default();
        format!("{name}: {what}: {message}{source}")
    };
    match status.code() {
        Code::ResourceExhausted => DataFusionError::ResourcesExhausted(text),
        Code::InvalidArgument => DataFusionError::Plan(text),
        _ => DataFusionError::Execution(text),
    }
}

/// An error and its sources, joined: transport errors hide the useful
/// part ("connection refused") several levels down.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cursor = e.source();
    while let Some(inner) = cursor {
        let text = inner.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cursor = inner.source();
    }
    parts.join(": ")
}

#[async_trait]
impl DeviceClient for FlightDeviceClient {
    fn id(&self) -> u32 {
        self.endpoint.id
    }

    fn name(&self) -> String {
        self.display_name()
    }

    fn link(&self) -> &Arc<Link> {
        &self.link
    }

    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn stats(&self) -> Result<DeviceStats> {
        let bytes = self.action(action::STATS, vec![]).await?;
        from_json_bytes(&bytes, "device stats").map_err(|e| self.protocol_error(e))
    }

    async fn manifest(&self) -> Result<Manifest> {
        let bytes = self.action(action::LIST_TABLES, vec![]).await?;
        manifest_from_json_bytes(&bytes, self.endpoint.id).map_err(|e| self.protocol_error(e))
    }

    async fn execute(
        &self,
        envelope: Vec<u8>,
    ) -> Result<BoxStream<'static, Result<DeviceMessage>>> {
        self.link
            .transfer(Direction::HostToDevice, envelope.len())
            .await;
        let timeout = self.options.stage_timeout;
        let request = self.request(
            Ticket {
                ticket: Bytes::from(envelope),
            },
            timeout,
        );
        let mut client = self.client();
        let call_timeout = self.options.call_timeout;
        let response = self
            .with_deadline("starting a stage", call_timeout, async move {
                client.do_get(request).await
            })
            .await?
            .into_inner();
        Ok(self.result_stream(response, timeout))
    }

    async fn read_range(&self, table: &str, partition: u32, range: Range<u64>) -> Result<Bytes> {
        let request = ReadRangeRequest {
            table: table.to_string(),
            partition,
            start: range.start,
            end: range.end,
        };
        let bytes = self
            .action(action::READ_RANGE, to_json_bytes(&request))
            .await?;
        self.storage_bytes
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(bytes)
    }

    async fn sample_keys(&self, request: &SampleKeysRequest) -> Result<RecordBatch> {
        let bytes = self
            .action_within(
                action::SAMPLE_KEYS,
                to_json_bytes(request),
                self.options.stage_timeout,
            )
            .await?;
        ipc_to_batch(&bytes).map_err(|e| self.protocol_error(format!("key sample: {e}")))
    }

    async fn sort_table(&self, request: &SortTableRequest) -> Result<Vec<FormatDescriptor>> {
        let bytes = self
            .action_within(
                action::SORT_TABLE,
                to_json_bytes(request),
                self.options.stage_timeout,
            )
            .await?;
        from_json_bytes(&bytes, "sort_table answer").map_err(|e| self.protocol_error(e))
    }

    fn storage_bytes_read(&self) -> u64 {
        self.storage_bytes.load(Ordering::Relaxed)
    }
}

/// One step of a stage result: a batch, the statistics, or nothing yet.
enum Step {
    Batch(RecordBatch),
    Skip,
}

impl FlightDeviceClient {
    /// Decodes a `do_get` answer into device messages: batches through
    /// [`ResultDecoder`], the data-less trailer as [`StageStats`].
    fn result_stream(
        &self,
        response: tonic::Streaming<FlightData>,
        timeout: Duration,
    ) -> BoxStream<'static, Result<DeviceMessage>> {
        let trailer: Arc<Mutex<Option<StageStats>>> = Arc::default();
        let slot = Arc::clone(&trailer);
        let link = Arc::clone(&self.link);
        let this = self.error_namer();
        let bad_trailer = self.error_namer();
        let raw = response.then(move |m| {
            let link = Arc::clone(&link);
            async move {
                if let Ok(m) = &m {
                    let size = m.data_header.len() + m.data_body.len() + m.app_metadata.len();
                    link.transfer(Direction::DeviceToHost, size).await;
                }
                m
            }
        });
        let without_trailer = raw.filter_map(move |m| {
            let slot = Arc::clone(&slot);
            let bad_trailer = bad_trailer.clone();
            async move {
                match m {
                    Err(status) => Some(Err(ArrowFlightError::Tonic(Box::new(status)))),
                    Ok(m) if m.data_header.is_empty() => {
                        match from_json_bytes::<StageStats>(&m.app_metadata, "stage statistics") {
                            Ok(stats) => *slot.lock().expect("trailer") = Some(stats),
                            Err(e) => {
                                return Some(Err(ArrowFlightError::ProtocolError(
                                    bad_trailer.describe(&e.to_string()),
                                )))
                            }
                        }
                        None
                    }
                    Ok(m) => Some(Ok(m)),
                }
            }
        });
        let storage = Arc::clone(&self.storage_bytes);
        // The decoder the embedded path uses: full validation, string
        // views checked per buffer rather than per row.
        let mut decoder = ResultDecoder::new();
        let batches = without_trailer.map(move |m| {
            let m = m.map_err(|e| this.flight_error(e))?;
            let body = Buffer::from(m.data_body);
            match decoder.decode_message(&m.data_header, &body) {
                Ok(batch) => Ok(batch.map_or(Step::Skip, Step::Batch)),
                Err(e) => Err(this.flight_error(ArrowFlightError::Arrow(e))),
            }
        });
        let deadline = tokio::time::Instant::now() + timeout;
        let namer = self.error_namer();
        let bounded = stream::unfold((batches.boxed(), false), move |(mut s, failed)| {
            let namer = namer.clone();
            async move {
                if failed {
                    return None;
                }
                match tokio::time::timeout_at(deadline, s.next()).await {
                    Ok(Some(Ok(step))) => Some((Ok(step), (s, false))),
                    Ok(Some(Err(e))) => Some((Err(e), (s, true))),
                    Ok(None) => None,
                    Err(_) => Some((Err(namer.deadline(timeout)), (s, true))),
                }
            }
        });
        let finished = stream::once(async move {
            let stats = trailer.lock().expect("trailer").take();
            stats.map(|s| {
                storage.fetch_add(s.bytes_read, Ordering::Relaxed);
                Ok(DeviceMessage::Done(s))
            })
        })
        .filter_map(|s| async move { s });
        bounded
            .filter_map(|step| async move {
                match step {
                    Ok(Step::Batch(b)) => Some(Ok(DeviceMessage::Batch(b))),
                    Ok(Step::Skip) => None,
                    Err(e) => Some(Err(e)),
                }
            })
            .chain(finished)
            .boxed()
    }

    fn error_namer(&self) -> ErrorNamer {
        ErrorNamer {
            name: Arc::from(self.display_name()),
        }
    }
}

/// Names the device in errors raised inside result streams.
#[derive(Clone)]
struct ErrorNamer {
    name: Arc<str>,
}

impl ErrorNamer {
    fn describe(&self, what: &str) -> String {
        format!("{}: {what}", self.name)
    }

    fn deadline(&self, after: Duration) -> DataFusionError {
        DataFusionError::Execution(self.describe(&format!(
            "stage exceeded its deadline of {} s (stage_timeout_secs)",
            after.as_secs_f64()
        )))
    }

    fn flight_error(&self, e: ArrowFlightError) -> DataFusionError {
        match e {
            ArrowFlightError::Tonic(status) => status_to_error(&self.name, &status),
            ArrowFlightError::ProtocolError(text) if text.starts_with(&*self.name) => {
                DataFusionError::Execution(text)
            }
            other => DataFusionError::Execution(
                self.describe(&format!("malformed result stream: {other}")),
            ),
        }
    }
}

impl PartitionSink for FlightDeviceClient {
    fn device_id(&self) -> u32 {
        self.endpoint.id
    }

    fn has_table(&self, table: &str) -> IngestResult<bool> {
        let manifest = self
            .block_on(self.manifest())
            .map_err(|e| IngestError::Remote(e.to_string()))?;
        Ok(manifest.tables.contains_key(table))
    }

    fn drop_table(&self, table: &str) -> IngestResult<()> {
        let body = to_json_bytes(&DropTableRequest {
            table: table.to_string(),
        });
        self.block_on(self.action(action::DROP_TABLE, body))
            .map_err(|e| IngestError::Remote(e.to_string()))?;
        Ok(())
    }

    fn write_partition(
        &self,
        table: &str,
        partition: u32,
        schema: SchemaRef,
        batches: BatchSource<'_>,
        options: &WriterOptions,
    ) -> IngestResult<()> {
        let request = PutRequest {
            table: table.to_string(),
            partition,
            row_group_rows_max: options.row_group_rows_max as u64,
            hybrid_key_columns: match &options.layout {
                PartitionLayout::Parquet => vec![],
                PartitionLayout::Hybrid { key_columns } => key_columns.clone(),
            },
            partitioning: options.partitioning.clone(),
        };
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let upload = {
            let this = self.clone_handle();
            self.handle
                .spawn(async move { this.put_partition(request, schema, rx).await })
        };
        let mut source_error = None;
        for batch in batches {
            match batch {
                Ok(b) => {
                    if tx.blocking_send(Ok(b)).is_err() {
                        break; // the upload failed; its error is reported below
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(ArrowFlightError::Arrow(
                        ArrowError::ExternalError(e.to_string().into()),
                    )));
                    source_error = Some(e);
                    break;
                }
            }
        }
        drop(tx);
        let outcome = self.block_on(upload).map_err(|e| {
            IngestError::Remote(format!("{}: upload task: {e}", self.display_name()))
        })?;
        if let Some(e) = source_error {
            return Err(IngestError::Input {
                path: format!("table {table} partition {partition}"),
                message: e.to_string(),
            });
        }
        outcome.map_err(|e| IngestError::Remote(e.to_string()))?;
        Ok(())
    }
}

impl FlightDeviceClient {
    /// A second handle on the same connection, for tasks that outlive a
    /// borrow.
    fn clone_handle(&self) -> Self {
        Self {
            endpoint: self.endpoint.clone(),
            channel: self.channel.clone(),
            capabilities: self.capabilities.clone(),
            link: Arc::clone(&self.link),
            options: self.options,
            storage_bytes: Arc::clone(&self.storage_bytes),
            handle: self.handle.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_messages_that_already_name_their_device() {
        assert!(names_device("device 3: holds no partition 2 of table t"));
        assert!(!names_device("device went away"));
        assert!(!names_device("transport error"));
    }

    #[test]
    fn statuses_become_errors_that_say_where_the_device_is() {
        let name = "device 3 at http://10.0.0.7:7001";
        let own = Status::invalid_argument("device 3: garbage plan");
        let e = status_to_error(name, &own);
        assert!(matches!(e, DataFusionError::Plan(_)), "{e}");
        assert!(
            e.to_string()
                .contains("device 3 at http://10.0.0.7:7001: garbage plan"),
            "{e}"
        );
        let lost = Status::unavailable("error reading a body");
        let e = status_to_error(name, &lost).to_string();
        assert!(
            e.contains(&format!(
                "{name}: connection lost or refused: error reading"
            )),
            "{e}"
        );
        let full = Status::resource_exhausted("device 3: memory budget");
        assert!(matches!(
            status_to_error(name, &full),
            DataFusionError::ResourcesExhausted(_)
        ));
    }
}
