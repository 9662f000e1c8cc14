//! The flight crate's error: what failed (a cluster file, a device
//! endpoint, a listening address, TLS) and where.

use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FlightError {
    /// A cluster file that cannot be read, parsed or written.
    #[error("cluster file {}: {message}", path.display())]
    ClusterFile { path: PathBuf, message: String },
    /// One device's entry or server.
    #[error("device {device}: {message}")]
    Endpoint { device: u32, message: String },
    /// Devices of a cluster file that did not answer.
    #[error("cannot reach {failed} of {total} devices in {}: {reasons}", path.display())]
    Unreachable {
        path: PathBuf,
        failed: usize,
        total: usize,
        reasons: String,
    },
    #[error("cannot listen for {what} on {addr}{hint} ({source})")]
    Listen {
        what: String,
        addr: SocketAddr,
        hint: &'static str,
        source: std::io::Error,
    },
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// A device server that cannot be reached.
    #[error("{name}: {message}")]
    Connect { name: String, message: String },
    /// A device server that answered the handshake wrongly (another id,
    /// another protocol version, a refused token).
    #[error("{message}")]
    Handshake { device: u32, message: String },
    /// A result chunk that is not a sequence of Arrow IPC messages.
    #[error("IPC chunk: {0}")]
    Ipc(String),
}
