//! Errors raised while decoding wire data.

/// Result alias for wire decoding.
pub type WireResult<T> = Result<T, WireError>;

/// A wire-level decoding failure. Every variant names what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("stage plan envelope: {0}")]
    Envelope(String),
    #[error("stage plan is {size} bytes, over plan_bytes_max={max} bytes")]
    PlanTooLarge { size: usize, max: usize },
    #[error("manifest {path}: {reason}")]
    Manifest { path: String, reason: String },
    #[error(
        "format descriptor of table {table} partition {partition}: unknown version {found} \
         (this build reads version {supported})"
    )]
    DescriptorVersion {
        table: String,
        partition: u32,
        found: u32,
        supported: u32,
    },
    #[error("partitioning of {what}: {reason}")]
    Partitioning { what: String, reason: String },
    #[error("{0}")]
    Invalid(String),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}
