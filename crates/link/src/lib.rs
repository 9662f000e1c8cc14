//! Host↔device links: every byte that crosses the device boundary passes
//! through a [`Link`], which meters it and, when configured, throttles it to
//! a rate so that experiments on one machine see the bottleneck real
//! hardware has. Throttling is an emulation and is reported as such.
//!
//! The throttle is a serial-link model: a transfer of `n` bytes occupies the
//! channel for `n / rate` seconds after the previous transfer finished, with
//! a small burst allowance so that short messages are not delayed by timer
//! granularity. Links can share a [`Throttle`]: embedded devices share the
//! host's port, so adding devices does not add host bandwidth (the premise
//! of near-data processing).

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// A link's rate, named or numeric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkProfile {
    /// `None` means unlimited.
    pub bytes_per_sec: Option<f64>,
    pub name: &'static str,
}

/// Named profiles (name, bytes per second).
pub const NAMED_PROFILES: &[(&str, Option<f64>)] = &[
    ("unlimited", None),
    ("pcie3x4", Some(3.2e9)),
    ("10gbe", Some(1.2e9)),
    ("sata3", Some(0.55e9)),
    ("1gbe", Some(0.125e9)),
];

impl LinkProfile {
    pub const UNLIMITED: LinkProfile = LinkProfile {
        bytes_per_sec: None,
        name: "unlimited",
    };

    pub fn is_throttled(&self) -> bool {
        self.bytes_per_sec.is_some()
    }
}

impl fmt::Display for LinkProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.bytes_per_sec {
            None => write!(f, "unlimited"),
            Some(r) if self.name == "custom" => write!(f, "{:.3} GB/s (emulated)", r / 1e9),
            Some(r) => write!(f, "{} ({:.3} GB/s, emulated)", self.name, r / 1e9),
        }
    }
}

/// Error for an unknown or malformed link profile.
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown link profile '{0}': use one of unlimited, pcie3x4, 10gbe, sata3, 1gbe, \
     or a rate in bytes per second such as 250e6 or 2.5GB/s"
)]
pub struct ProfileError(String);

impl FromStr for LinkProfile {
    type Err = ProfileError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        if let Some((name, rate)) = NAMED_PROFILES.iter().find(|(n, _)| *n == lower) {
            return Ok(LinkProfile {
                bytes_per_sec: *rate,
                name,
            });
        }
        let (number, scale) = match lower.strip_suffix("gb/s") {
            Some(n) => (n, 1e9),
            None => match lower.strip_suffix("mb/s") {
                Some(n) => (n, 1e6),
                None => (lower.as_str(), 1.0),
            },
        };
        let rate: f64 = number
            .trim()
            .parse()
            .map_err(|_| ProfileError(s.to_string()))?;
        if !(rate.is_finite() && rate > 0.0) {
            return Err(ProfileError(s.to_string()));
        }
        Ok(LinkProfile {
            bytes_per_sec: Some(rate * scale),
            name: "custom",
        })
    }
}

/// Direction of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    HostToDevice,
    DeviceToHost,
}

/// Byte counts of a link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkCounters {
    pub bytes_to_device: u64,
    pub bytes_to_host: u64,
    pub messages: u64,
}

impl LinkCounters {
    pub fn total(&self) -> u64 {
        self.bytes_to_device + self.bytes_to_host
    }

    pub fn since(&self, earlier: &LinkCounters) -> LinkCounters {
        LinkCounters {
            bytes_to_device: self.bytes_to_device - earlier.bytes_to_device,
            bytes_to_host: self.bytes_to_host - earlier.bytes_to_host,
            messages: self.messages - earlier.messages,
        }
    }
}

/// Burst allowance of a throttled link: transfers may run this far ahead of
/// the rate before they wait.
const BURST: Duration = Duration::from_millis(2);

/// The rate limit of a link: a serial channel with a timeline. Several
/// [`Link`]s may share one throttle, as devices share a host's port.
#[derive(Debug)]
pub struct Throttle {
    bytes_per_sec: Option<f64>,
    /// When the channel is next free.
    busy_until: Mutex<Option<Instant>>,
}

impl Throttle {
    pub fn new(profile: LinkProfile) -> Self {
        Self {
            bytes_per_sec: profile.bytes_per_sec,
            busy_until: Mutex::new(None),
        }
    }

    /// Books `bytes` on the timeline and returns how long the caller must
    /// wait for the transfer to complete, if longer than the burst.
    fn reserve(&self, bytes: usize, now: Instant) -> Option<Duration> {
        let rate = self.bytes_per_sec?;
        let cost = Duration::from_secs_f64(bytes as f64 / rate);
        let mut busy = self.busy_until.lock().expect("throttle lock");
        let start = busy.map_or(now, |b| b.max(now));
        let done = start + cost;
        *busy = Some(done);
        let wait = done.saturating_duration_since(now);
        (wait > BURST).then_some(wait)
    }
}

/// A metered, optionally throttled link between the host and one device.
#[derive(Debug)]
pub struct Link {
    profile: LinkProfile,
    to_device: AtomicU64,
    to_host: AtomicU64,
    messages: AtomicU64,
    throttle: Arc<Throttle>,
}

impl Link {
    /// A link with a throttle of its own.
    pub fn new(profile: LinkProfile) -> Self {
        Self::sharing(profile, Arc::new(Throttle::new(profile)))
    }

    /// A link whose bandwidth is `throttle`'s, shared with other links.
    pub fn sharing(profile: LinkProfile, throttle: Arc<Throttle>) -> Self {
        Self {
            profile,
            to_device: AtomicU64::new(0),
            to_host: AtomicU64::new(0),
            messages: AtomicU64::new(0),
            throttle,
        }
    }

    pub fn profile(&self) -> LinkProfile {
        self.profile
    }

    /// Counts `bytes` crossing the link and waits as long as the link's rate
    /// demands. Both directions share one serial channel.
    pub async fn transfer(&self, direction: Direction, bytes: usize) {
        if let Some(wait) = self.throttle.reserve(bytes, Instant::now()) {
            tokio::time::sleep(wait).await;
        }
        self.arrived(direction, bytes);
    }

    /// [`Link::transfer`] for a caller on a thread of its own (writes
    /// from ingest, which are synchronous): the thread sleeps.
    pub fn transfer_blocking(&self, direction: Direction, bytes: usize) {
        if let Some(wait) = self.throttle.reserve(bytes, Instant::now()) {
            std::thread::sleep(wait);
        }
        self.arrived(direction, bytes);
    }

    /// Counted on arrival: a transfer its receiver gave up on never arrived
    /// (its time on the channel stays booked, as on a real link).
    fn arrived(&self, direction: Direction, bytes: usize) {
        let counter = match direction {
            Direction::HostToDevice => &self.to_device,
            Direction::DeviceToHost => &self.to_host,
        };
        counter.fetch_add(bytes as u64, Ordering::Relaxed);
        self.messages.fetch_add(1, Ordering::Relaxed);
    }

    pub fn counters(&self) -> LinkCounters {
        LinkCounters {
            bytes_to_device: self.to_device.load(Ordering::Relaxed),
            bytes_to_host: self.to_host.load(Ordering::Relaxed),
            messages: self.messages.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_profiles() {
        assert_eq!(
            "10gbe".parse::<LinkProfile>().unwrap().bytes_per_sec,
            Some(1.2e9)
        );
        assert_eq!(
            "unlimited".parse::<LinkProfile>().unwrap().bytes_per_sec,
            None
        );
        assert_eq!(
            "2.5GB/s".parse::<LinkProfile>().unwrap().bytes_per_sec,
            Some(2.5e9)
        );
        assert_eq!(
            "250e6".parse::<LinkProfile>().unwrap().bytes_per_sec,
            Some(250e6)
        );
        for bad in ["", "fast", "-1", "0", "nan"] {
            let err = bad.parse::<LinkProfile>().unwrap_err().to_string();
            assert!(err.contains("unknown link profile"), "{err}");
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn throttles_to_rate_and_meters_both_directions() {
        let link = Link::new("1000000".parse().unwrap()); // 1 MB/s
        let start = Instant::now();
        link.transfer(Direction::DeviceToHost, 50_000).await;
        link.transfer(Direction::HostToDevice, 25_000).await;
        let elapsed = start.elapsed();
        // 75 kB at 1 MB/s occupy the link for 75 ms.
        assert!(elapsed >= Duration::from_millis(73), "{elapsed:?}");
        assert!(elapsed < Duration::from_millis(500), "{elapsed:?}");
        let c = link.counters();
        assert_eq!(
            (c.bytes_to_host, c.bytes_to_device, c.messages),
            (50_000, 25_000, 2)
        );
    }

    #[test]
    fn a_blocking_transfer_waits_and_counts_like_an_async_one() {
        let link = Link::new("1000000".parse().unwrap()); // 1 MB/s
        let start = Instant::now();
        link.transfer_blocking(Direction::HostToDevice, 40_000);
        link.transfer_blocking(Direction::DeviceToHost, 10_000);
        // 50 kB at 1 MB/s occupy the link for 50 ms.
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_millis(48), "{elapsed:?}");
        assert!(elapsed < Duration::from_millis(500), "{elapsed:?}");
        let c = link.counters();
        assert_eq!(
            (c.bytes_to_device, c.bytes_to_host, c.messages),
            (40_000, 10_000, 2)
        );
    }

    #[test]
    fn unlimited_never_waits() {
        let throttle = Throttle::new(LinkProfile::UNLIMITED);
        assert_eq!(throttle.reserve(usize::MAX / 2, Instant::now()), None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn links_sharing_a_throttle_share_its_bandwidth() {
        let profile: LinkProfile = "1000000".parse().unwrap(); // 1 MB/s
        let port = Arc::new(Throttle::new(profile));
        let (a, b) = (
            Link::sharing(profile, port.clone()),
            Link::sharing(profile, port),
        );
        let start = Instant::now();
        tokio::join!(
            a.transfer(Direction::DeviceToHost, 40_000),
            b.transfer(Direction::DeviceToHost, 40_000)
        );
        // Alone each would take 40 ms; sharing, the second finishes at 80 ms.
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_millis(78), "{elapsed:?}");
        assert_eq!(
            a.counters().bytes_to_host + b.counters().bytes_to_host,
            80_000
        );
    }
}

#[cfg(test)]
mod concurrency_tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_concurrent_transfers_respect_the_rate() {
        let profile: LinkProfile = "5MB/s".parse().unwrap();
        let port = Arc::new(Throttle::new(profile));
        let links: Vec<_> = (0..4)
            .map(|_| Arc::new(Link::sharing(profile, port.clone())))
            .collect();
        let start = Instant::now();
        let mut tasks = vec![];
        for (i, l) in links.iter().enumerate() {
            let l = l.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    l.transfer(Direction::DeviceToHost, 10_000 + i * 1000).await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let total: u64 = links.iter().map(|l| l.counters().bytes_to_host).sum();
        let elapsed = start.elapsed().as_secs_f64();
        let expected = total as f64 / 5e6;
        assert!(elapsed >= expected * 0.98, "{elapsed} < {expected}");
    }
}
