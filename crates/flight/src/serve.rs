//! Running a device server: bind (with clear errors), serve Flight and the
//! metrics endpoint, shut down gracefully.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use insitu_device::Device;
use insitu_wire::protocol::GRPC_MESSAGE_BYTES_MAX;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::error::FlightError;
use crate::service::{DeviceService, ServerState};

/// PEM certificate chain and private key for TLS.
#[derive(Debug, Clone)]
pub struct TlsIdentity {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    /// Bearer token every call must present; `None` accepts any caller.
    pub token: Option<String>,
    pub tls: Option<TlsIdentity>,
    /// Address of the Prometheus endpoint, if any.
    pub metrics: Option<SocketAddr>,
    /// How long in-flight streams may run after a shutdown signal before
    /// they are cancelled (`drain_secs`).
    pub drain: Duration,
}

impl ServeOptions {
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            token: None,
            tls: None,
            metrics: None,
            drain: Duration::from_secs(10),
        }
    }
}

/// A server whose sockets are bound; [`BoundServer::run`] serves them.
pub struct BoundServer {
    state: Arc<ServerState>,
    listener: TcpListener,
    metrics: Option<TcpListener>,
    options: ServeOptions,
}

async fn listen(addr: SocketAddr, what: &str) -> Result<TcpListener, FlightError> {
    TcpListener::bind(addr).await.map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                ": address already in use (another process holds the port; choose another)"
            }
            std::io::ErrorKind::PermissionDenied => ": permission denied (ports below 1024?)",
            std::io::ErrorKind::AddrNotAvailable => ": no such local address",
            _ => "",
        };
        FlightError::Listen {
            what: what.to_string(),
            addr,
            hint,
            source: e,
        }
    })
}

/// Binds the Flight and metrics sockets of `device`.
pub async fn bind(device: Arc<Device>, options: ServeOptions) -> Result<BoundServer, FlightError> {
    let listener = listen(options.listen, "Flight").await?;
    let metrics = match options.metrics {
        Some(addr) => Some(listen(addr, "metrics").await?),
        None => None,
    };
    Ok(BoundServer {
        state: ServerState::new(device, options.token.clone()),
        listener,
        metrics,
        options,
    })
}

impl BoundServer {
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound socket")
    }

    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics
            .as_ref()
            .map(|l| l.local_addr().expect("bound socket"))
    }

    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// Serves until `shutdown` resolves, then lets in-flight streams finish
    /// for up to the drain time and cancels the rest.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), FlightError> {
        let device = self.state.device.id();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        if let Some(listener) = self.metrics {
            let router = crate::metrics::router(Arc::clone(&self.state));
            let mut stop = stop_rx.clone();
            tokio::spawn(async move {
                let graceful = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                if let Err(e) = axum::serve(listener, router)
                    .with_graceful_shutdown(graceful)
                    .await
                {
                    tracing::error!(device, "metrics endpoint failed: {e}");
                }
            });
        }
        let service = FlightServiceServer::new(DeviceService::new(Arc::clone(&self.state)))
            .max_decoding_message_size(GRPC_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(GRPC_MESSAGE_BYTES_MAX);
        let mut builder = Server::builder()
            .tcp_nodelay(true)
            .http2_keepalive_interval(Some(Duration::from_secs(1)))
            .http2_keepalive_timeout(Some(Duration::from_secs(2)));
        if let Some(tls) = &self.options.tls {
            let identity = Identity::from_pem(&tls.cert_pem, &tls.key_pem);
            builder = builder
                .tls_config(ServerTlsConfig::new().identity(identity))
                .map_err(|e| FlightError::Tls(e.to_string()))?;
        }
        let incoming = TcpIncoming::from(self.listener).with_nodelay(Some(true));
        let mut stopped = stop_rx.clone();
        let signal = async move {
            shutdown.await;
            tracing::info!(device, "shutting down: no new calls, draining streams");
            let _ = stop_tx.send(true);
        };
        let server = builder
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, signal);
        let drain = self.options.drain;
        tokio::select! {
            served = server => served.map_err(|e| FlightError::Endpoint {
                device,
                message: e.to_string(),
            }),
            _ = async move {
                let _ = stopped.wait_for(|s| *s).await;
                tokio::time::sleep(drain).await;
            } => {
                tracing::warn!(device, "streams still running after {drain:?}; cancelling them");
                Ok(())
            }
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn termination_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
