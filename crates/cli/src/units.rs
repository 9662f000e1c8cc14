//! Human-friendly sizes: `4GiB`, `512MiB`, `1.5GB`, `1000`.

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

/// How many times fewer link bytes pushdown moved than pull (`ratio` =
/// pull / push), as words: whole numbers from 10x, two decimals below,
/// and under 1x the other way round, so that pushdown moving more is
/// never shown as "1x fewer".
pub fn link_reduction_words(ratio: f64) -> String {
    if ratio >= 10.0 {
        format!("{ratio:.0}x fewer")
    } else if ratio >= 1.0 {
        format!("{ratio:.2}x fewer")
    } else if ratio > 0.0 {
        format!("{:.2}x more", 1.0 / ratio)
    } else {
        "no link bytes to compare".into()
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
    fn link_reductions_under_one_say_more() {
        assert_eq!(link_reduction_words(1617.4), "1617x fewer");
        assert_eq!(link_reduction_words(1.547), "1.55x fewer");
        assert_eq!(link_reduction_words(85.40 / 140.83), "1.65x more");
        assert_eq!(link_reduction_words(0.0), "no link bytes to compare");
    }
}
