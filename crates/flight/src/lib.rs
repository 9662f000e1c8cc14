//! Devices as network servers, over Arrow Flight.
//!
//! A device server ([`serve`]) wraps the same [`insitu_device::Device`]
//! that embedded mode runs in-process: the host sends the same stage-plan
//! envelopes and gets the same results, now as a standard Flight stream.
//! [`FlightDeviceClient`] is the host's side; [`cluster`] reads the TOML
//! file that lists a cluster's devices. The protocol's wire types live in
//! [`insitu_wire::protocol`].

pub mod client;
pub mod cluster;
mod error;
pub mod metrics;
pub mod serve;
pub mod service;
mod split;

pub use client::{ClientOptions, DeviceEndpoint, FlightDeviceClient};
pub use cluster::{connect as connect_cluster, ClusterFile, DeviceEntry};
pub use error::FlightError;
pub use serve::{bind, termination_signal, BoundServer, ServeOptions, TlsIdentity};
pub use service::{DeviceService, ServerState};
pub use split::ipc_chunk_to_flight;
