//! Sizes as people write them (`4GiB`, `512MiB`, `1.5GB`, `1000`), for
//! command lines and configuration files alike.

/// Parses a byte size with an optional binary (KiB, MiB, GiB, TiB) or
/// decimal (KB, MB, GB, TB) suffix.
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.trim().is_empty() {
        return Err(format!(
            "'{s}' is not a size (examples: 4GiB, 512MiB, 1000000)"
        ));
    }
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024.0 * 1024.0,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        "tib" | "t" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        other => {
            return Err(format!(
                "unknown size unit '{other}' in '{s}' (use B, KiB, MiB, GiB, KB, MB, GB)"
            ))
        }
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a size (examples: 4GiB, 512MiB, 1000000)"))?;
    if !(n.is_finite() && n >= 0.0) {
        return Err(format!("'{s}' is not a size"));
    }
    Ok((n * scale) as usize)
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// A size in a configuration file: a number of bytes or a string with a
/// unit (`host_mem = "4GiB"`, `"host_mem": 4294967296`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub usize);

impl serde::Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0 as u64)
    }
}

impl<'de> serde::Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Form {
            Bytes(u64),
            Text(String),
        }
        match Form::deserialize(d)? {
            Form::Bytes(n) => usize::try_from(n)
                .map(ByteSize)
                .map_err(|_| serde::de::Error::custom(format!("{n} bytes is too large"))),
            Form::Text(t) => parse_bytes(&t)
                .map(ByteSize)
                .map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_bytes("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_bytes("512 MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1.5GB").unwrap(), 1_500_000_000);
        assert_eq!(parse_bytes("1000").unwrap(), 1000);
        assert!(parse_bytes("lots").unwrap_err().contains("not a size"));
        assert!(parse_bytes("3 parsecs")
            .unwrap_err()
            .contains("unknown size unit"));
        assert_eq!(human_bytes(1536), "1.50 KiB");
    }

    #[test]
    fn config_sizes_take_numbers_or_units() {
        let n: ByteSize = serde_json::from_str("1048576").unwrap();
        let t: ByteSize = serde_json::from_str("\"1MiB\"").unwrap();
        assert_eq!(n, t);
        let bad = serde_json::from_str::<ByteSize>("\"a lot\"").unwrap_err();
        assert!(bad.to_string().contains("not a size"), "{bad}");
    }
}
