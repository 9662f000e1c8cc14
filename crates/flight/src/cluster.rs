//! Cluster files: which device servers make up a cluster, and how to reach
//! them.
//!
//! ```toml
//! [[device]]
//! id = 0
//! endpoint = "http://127.0.0.1:7001"
//! token_file = "token"        # relative to this file
//! link = "10gbe"              # optional, default unlimited
//! # tls_ca = "ca.pem"         # for https endpoints
//! # pid = 1234, dir = "dev0"  # written by `insitu cluster up`
//!
//! [host]                      # optional: the host's settings
//! mem = "8GiB"                # host_mem_bytes_max (--host-mem overrides)
//! spill_dir = "spill"         # relative to this file; default .host-spill
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use insitu_link::{Link, LinkProfile, Throttle};
use insitu_wire::units::ByteSize;
use serde::{Deserialize, Serialize};

use crate::client::{ClientOptions, DeviceEndpoint, FlightDeviceClient};
use crate::error::FlightError;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceEntry {
    pub id: u32,
    pub endpoint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<PathBuf>,
    /// Process id of a server started by `cluster up`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Data directory of a server started by `cluster up`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
}

/// The `[host]` table: settings of hosts that use the cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostEntry {
    /// The host's memory budget: bytes or a size such as `"8GiB"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<ByteSize>,
    /// Where the host spills, relative to the cluster file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spill_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    #[serde(rename = "device", default)]
    pub devices: Vec<DeviceEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostEntry>,
}

/// Where hosts using a cluster spill when its file names no `spill_dir`.
pub const HOST_SPILL_DIR_DEFAULT: &str = ".host-spill";

impl ClusterFile {
    /// The host's memory budget the file sets, if any.
    pub fn host_mem(&self) -> Option<usize> {
        self.host.as_ref().and_then(|h| h.mem).map(|b| b.0)
    }

    /// Where hosts using the cluster of file `path` spill.
    pub fn host_spill_root(&self, path: &Path) -> PathBuf {
        let dir = self
            .host
            .as_ref()
            .and_then(|h| h.spill_dir.clone())
            .unwrap_or_else(|| PathBuf::from(HOST_SPILL_DIR_DEFAULT));
        resolve(path, &dir)
    }
}

impl ClusterFile {
    /// Reads and checks a cluster file: at least one device, unique ids,
    /// parseable link profiles.
    pub fn load(path: &Path) -> Result<Self, FlightError> {
        let err = |message: String| FlightError::ClusterFile {
            path: path.to_path_buf(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let file: ClusterFile = toml::from_str(&text).map_err(|e| err(e.to_string()))?;
        if file.devices.is_empty() {
            return Err(err("lists no [[device]]".into()));
        }
        let mut ids: Vec<u32> = file.devices.iter().map(|d| d.id).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(err(format!("device id {} appears twice", w[0])));
        }
        for d in &file.devices {
            if let Some(link) = &d.link {
                link.parse::<LinkProfile>()
                    .map_err(|e| err(format!("device {}: link: {e}", d.id)))?;
            }
        }
        Ok(file)
    }

    /// Writes the file atomically (temp file, fsync, rename).
    pub fn store(&self, path: &Path) -> Result<(), FlightError> {
        let text = toml::to_string_pretty(self).map_err(|e| FlightError::ClusterFile {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let text = format!("# insitu cluster: one [[device]] per device server\n{text}");
        insitu_format::write_atomically(path, text.as_bytes()).map_err(|e| {
            FlightError::ClusterFile {
                path: path.to_path_buf(),
                message: e.to_string(),
            }
        })
    }
}

/// `path` relative to the cluster file's directory, unless absolute.
pub fn resolve(cluster_file: &Path, path: &Path) -> PathBuf {
    match cluster_file.parent() {
        Some(dir) if path.is_relative() => dir.join(path),
        _ => path.to_path_buf(),
    }
}

/// How each device is reached, with its token and CA read from disk.
pub fn endpoints(path: &Path, file: &ClusterFile) -> Result<Vec<DeviceEndpoint>, FlightError> {
    file.devices
        .iter()
        .map(|d| {
            let read = |p: &Path, what: &str| {
                let full = resolve(path, p);
                std::fs::read(&full).map_err(|e| FlightError::Endpoint {
                    device: d.id,
                    message: format!("cannot read {what} {}: {e}", full.display()),
                })
            };
            let token = match &d.token_file {
                Some(p) => {
                    let bytes = read(p, "token file")?;
                    let token = String::from_utf8_lossy(&bytes).trim().to_string();
                    if token.is_empty() {
                        return Err(FlightError::Endpoint {
                            device: d.id,
                            message: "token file is empty".into(),
                        });
                    }
                    Some(token)
                }
                None => None,
            };
            let tls_ca = d
                .tls_ca
                .as_deref()
                .map(|p| read(p, "CA certificate"))
                .transpose()?;
            Ok(DeviceEndpoint {
                id: d.id,
                url: d.endpoint.clone(),
                token,
                tls_ca,
            })
        })
        .collect()
}

/// Connects to every device of a cluster file. With `link_override`, all
/// devices share one throttle of that profile (the host's port); otherwise
/// each device's link follows its entry. Every device that cannot be
/// reached is named in the error.
pub async fn connect(
    path: &Path,
    link_override: Option<LinkProfile>,
    options: ClientOptions,
) -> Result<Vec<Arc<FlightDeviceClient>>, FlightError> {
    let file = ClusterFile::load(path)?;
    let endpoints = endpoints(path, &file)?;
    let shared = link_override.map(|p| (p, Arc::new(Throttle::new(p))));
    let attempts = endpoints.into_iter().zip(&file.devices).map(|(ep, entry)| {
        let link = match &shared {
            Some((profile, throttle)) => Link::sharing(*profile, Arc::clone(throttle)),
            None => Link::new(
                entry
                    .link
                    .as_deref()
                    .map(|l| l.parse().expect("checked at load"))
                    .unwrap_or(LinkProfile::UNLIMITED),
            ),
        };
        FlightDeviceClient::connect(ep, Arc::new(link), options)
    });
    let results = futures::future::join_all(attempts).await;
    let total = results.len();
    let (ok, failed): (Vec<_>, Vec<_>) = results.into_iter().partition(|r| r.is_ok());
    if !failed.is_empty() {
        let reasons: Vec<String> = failed
            .into_iter()
            .filter_map(|r| r.err().map(|e| e.to_string()))
            .collect();
        return Err(FlightError::Unreachable {
            path: path.to_path_buf(),
            failed: reasons.len(),
            total,
            reasons: reasons.join("; "),
        });
    }
    Ok(ok
        .into_iter()
        .map(|r| Arc::new(r.expect("partitioned")))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_duplicates_and_bad_links() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.toml");
        let file = ClusterFile {
            devices: vec![
                DeviceEntry {
                    id: 0,
                    endpoint: "http://127.0.0.1:7001".into(),
                    token_file: Some("token".into()),
                    link: Some("10gbe".into()),
                    tls_ca: None,
                    pid: Some(42),
                    dir: None,
                },
                DeviceEntry {
                    id: 1,
                    endpoint: "http://127.0.0.1:7002".into(),
                    token_file: None,
                    link: None,
                    tls_ca: None,
                    pid: None,
                    dir: None,
                },
            ],
            host: Some(HostEntry {
                mem: Some(ByteSize(3 << 30)),
                spill_dir: Some("spill".into()),
            }),
        };
        file.store(&path).unwrap();
        let loaded = ClusterFile::load(&path).unwrap();
        assert_eq!(loaded, file);
        assert_eq!(loaded.host_mem(), Some(3 << 30));
        assert_eq!(loaded.host_spill_root(&path), dir.path().join("spill"));

        std::fs::write(
            &path,
            "[[device]]\nid = 0\nendpoint = \"a\"\n[host]\nmem = \"2GiB\"\n",
        )
        .unwrap();
        let loaded = ClusterFile::load(&path).unwrap();
        assert_eq!(loaded.host_mem(), Some(2 << 30));
        assert_eq!(
            loaded.host_spill_root(&path),
            dir.path().join(".host-spill")
        );
        std::fs::write(
            &path,
            "[[device]]\nid = 0\nendpoint = \"a\"\n[host]\nmem = \"plenty\"\n",
        )
        .unwrap();
        let e = ClusterFile::load(&path).unwrap_err().to_string();
        assert!(e.contains("not a size"), "{e}");

        std::fs::write(
            &path,
            "[[device]]\nid = 1\nendpoint = \"a\"\n[[device]]\nid = 1\nendpoint = \"b\"\n",
        )
        .unwrap();
        let e = ClusterFile::load(&path).unwrap_err().to_string();
        assert!(e.contains("device id 1 appears twice"), "{e}");

        std::fs::write(
            &path,
            "[[device]]\nid = 0\nendpoint = \"a\"\nlink = \"carrier pigeon\"\n",
        )
        .unwrap();
        let e = ClusterFile::load(&path).unwrap_err().to_string();
        assert!(e.contains("device 0: link"), "{e}");

        std::fs::write(&path, "[[device]]\nid = 0\nendpont = \"a\"\n").unwrap();
        let e = ClusterFile::load(&path).unwrap_err().to_string();
        assert!(e.contains("endpont"), "{e}");

        std::fs::write(&path, "").unwrap();
        let e = ClusterFile::load(&path).unwrap_err().to_string();
        assert!(e.contains("lists no [[device]]"), "{e}");
    }

    #[test]
    fn missing_token_file_names_the_device_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let file = ClusterFile {
            devices: vec![DeviceEntry {
                id: 4,
                endpoint: "http://127.0.0.1:1".into(),
                token_file: Some("nope".into()),
                link: None,
                tls_ca: None,
                pid: None,
                dir: None,
            }],
            host: None,
        };
        let e = endpoints(&path, &file).unwrap_err().to_string();
        assert!(e.contains("device 4: cannot read token file"), "{e}");
        assert!(e.contains("nope"), "{e}");
    }
}
