//! The CLI's error: a library's typed error, or a message about the
//! command line or the terminal. `main` prints it after `error: `.

use insitu_session::SessionError;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Session(#[from] SessionError),
    #[error("{0}")]
    Message(String),
}

pub type CliResult<T> = Result<T, CliError>;

impl From<String> for CliError {
    fn from(message: String) -> Self {
        CliError::Message(message)
    }
}

impl From<&str> for CliError {
    fn from(message: &str) -> Self {
        CliError::Message(message.to_string())
    }
}

/// Library errors without a variant of their own keep their message.
macro_rules! message_from {
    ($($t:ty),*) => {$(
        impl From<$t> for CliError {
            fn from(e: $t) -> Self {
                CliError::Message(e.to_string())
            }
        }
    )*};
}

message_from!(
    insitu_device::DeviceError,
    insitu_device::root::RootError,
    insitu_flight::FlightError,
    insitu_ingest::IngestError,
    insitu_calibrate::CalibrateError,
    insitu_extsort::ExtsortError,
    datafusion::error::DataFusionError,
    arrow::error::ArrowError,
    std::io::Error
);
