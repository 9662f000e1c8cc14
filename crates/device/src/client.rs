//! [`EmbeddedClient`]: the host's [`DeviceClient`] for a device in this
//! process. Every exchange crosses the device's [`Link`], which meters
//! and throttles it: the device lives in the host's process, but its
//! inputs and outputs are still bytes.

use std::ops::Range;
use std::sync::Arc;

use crate::Device;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use bytes::Bytes;
use datafusion::common::{DataFusionError, Result};
use futures::stream::{BoxStream, StreamExt};
use insitu_client::{
    batch_to_ipc, ipc_to_batch, DeviceClient, DeviceMessage, REQUEST_HEADER_BYTES,
};
use insitu_link::{Direction, Link};
use insitu_wire::protocol::{from_json_bytes, to_json_bytes};
use insitu_wire::{
    Capabilities, DeviceStats, FormatDescriptor, Manifest, SampleKeysRequest, SortTableRequest,
};

/// A device in this process.
#[derive(Debug)]
pub struct EmbeddedClient {
    device: Arc<Device>,
    link: Arc<Link>,
    capabilities: Capabilities,
}

impl EmbeddedClient {
    pub fn new(device: Arc<Device>, link: Arc<Link>) -> Self {
        let capabilities = device.capabilities();
        Self {
            device,
            link,
            capabilities,
        }
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }
}

#[async_trait]
impl DeviceClient for EmbeddedClient {
    fn id(&self) -> u32 {
        self.device.id()
    }

    fn link(&self) -> &Arc<Link> {
        &self.link
    }

    fn in_process(&self) -> bool {
        true
    }

    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    async fn stats(&self) -> Result<DeviceStats> {
        let mut stats = self.device.stats();
        let link = self.link.counters();
        stats.bytes_sent = link.bytes_to_host;
        stats.bytes_received = link.bytes_to_device;
        Ok(stats)
    }

    async fn manifest(&self) -> Result<Manifest> {
        self.link
            .transfer(Direction::HostToDevice, REQUEST_HEADER_BYTES)
            .await;
        let bytes = self.device.manifest().to_json();
        self.link
            .transfer(Direction::DeviceToHost, bytes.len())
            .await;
        Manifest::from_json(&bytes, &format!("device {} manifest", self.id()))
            .map_err(|e| DataFusionError::Execution(e.to_string()))
    }

    async fn execute(
        &self,
        envelope: Vec<u8>,
    ) -> Result<BoxStream<'static, Result<DeviceMessage>>> {
        self.link
            .transfer(Direction::HostToDevice, envelope.len())
            .await;
        let rx = self
            .device
            .execute(&envelope)
            .map_err(|e| e.into_datafusion())?;
        let link = Arc::clone(&self.link);
        let stream = futures::stream::unfold(rx, move |mut rx| {
            let link = Arc::clone(&link);
            async move {
                let msg = rx.recv().await?;
                let msg = match msg {
                    Ok(DeviceMessage::Ipc(bytes)) => {
                        link.transfer(Direction::DeviceToHost, bytes.len()).await;
                        Ok(DeviceMessage::Ipc(bytes))
                    }
                    Ok(DeviceMessage::Batch(batch)) => Ok(DeviceMessage::Batch(batch)),
                    Ok(DeviceMessage::Done(stats)) => {
                        link.transfer(Direction::DeviceToHost, REQUEST_HEADER_BYTES)
                            .await;
                        Ok(DeviceMessage::Done(stats))
                    }
                    Err(e) => Err(e.into_datafusion()),
                };
                Some((msg, rx))
            }
        });
        Ok(stream.boxed())
    }

    async fn read_range(&self, table: &str, partition: u32, range: Range<u64>) -> Result<Bytes> {
        self.link
            .transfer(Direction::HostToDevice, REQUEST_HEADER_BYTES)
            .await;
        let bytes = self
            .device
            .read_range(table, partition, range)
            .await
            .map_err(|e| e.into_datafusion())?;
        self.link
            .transfer(Direction::DeviceToHost, bytes.len())
            .await;
        Ok(bytes)
    }

    fn storage_bytes_read(&self) -> u64 {
        self.device.bytes_read()
    }

    async fn sample_keys(&self, request: &SampleKeysRequest) -> Result<RecordBatch> {
        let answer = self
            .call(to_json_bytes(request), |device, body| {
                let request: SampleKeysRequest = from_json_bytes(&body, "sample_keys request")
                    .map_err(|e| DataFusionError::Plan(e.to_string()))?;
                let sample = device
                    .sample_keys(&request)
                    .map_err(|e| e.into_datafusion())?;
                Ok(batch_to_ipc(&sample)?)
            })
            .await?;
        Ok(ipc_to_batch(&answer)?)
    }

    async fn sort_table(&self, request: &SortTableRequest) -> Result<Vec<FormatDescriptor>> {
        let answer = self
            .call(to_json_bytes(request), |device, body| {
                let request: SortTableRequest = from_json_bytes(&body, "sort_table request")
                    .map_err(|e| DataFusionError::Plan(e.to_string()))?;
                let written = device
                    .sort_table(&request)
                    .map_err(|e| e.into_datafusion())?;
                Ok(to_json_bytes(&written))
            })
            .await?;
        from_json_bytes(&answer, "sort_table answer")
            .map_err(|e| DataFusionError::Execution(e.to_string()))
    }
}

impl EmbeddedClient {
    /// Sends `body` over the link, runs `work` on the device off the async
    /// threads, and brings its answer back over the link.
    async fn call(
        &self,
        body: Vec<u8>,
        work: impl FnOnce(Arc<Device>, Vec<u8>) -> Result<Vec<u8>> + Send + 'static,
    ) -> Result<Vec<u8>> {
        self.link
            .transfer(Direction::HostToDevice, body.len())
            .await;
        let device = Arc::clone(&self.device);
        let answer = blocking(move || work(device, body)).await?;
        self.link
            .transfer(Direction::DeviceToHost, answer.len())
            .await;
        Ok(answer)
    }
}

/// Runs blocking device work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DataFusionError::Execution(format!("device task failed: {e}")))?
}

/// Wraps in-process devices as clients. Each has its own metered link, and
/// all links share one throttle of `profile`'s rate: the host's port, whose
/// bandwidth does not grow with the number of devices.
pub fn embedded(
    devices: Vec<Arc<Device>>,
    profile: insitu_link::LinkProfile,
) -> Vec<Arc<EmbeddedClient>> {
    let host_port = Arc::new(insitu_link::Throttle::new(profile));
    devices
        .into_iter()
        .map(|d| {
            let link = Link::sharing(profile, Arc::clone(&host_port));
            Arc::new(EmbeddedClient::new(d, Arc::new(link)))
        })
        .collect()
}

/// [`embedded`] as the host takes them.
pub fn embedded_clients(
    devices: Vec<Arc<Device>>,
    profile: insitu_link::LinkProfile,
) -> Vec<Arc<dyn DeviceClient>> {
    embedded(devices, profile)
        .into_iter()
        .map(|c| c as Arc<dyn DeviceClient>)
        .collect()
}
