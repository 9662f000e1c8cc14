//! Human-friendly sizes (`4GiB`, `512MiB`, `1.5GB`, `1000`; parsed by
//! the wire crate, whose configuration files take them too) and speed ratios.

pub use insitu_wire::units::{human_bytes, parse_bytes};

/// A speed ratio (`ratio` = the other's time / this one's) as words:
/// "1.48x faster" or "1.19x slower", never "0.84x faster".
pub fn speed_words(ratio: f64) -> String {
    if !ratio.is_finite() || ratio <= 0.0 {
        "–".into()
    } else if ratio >= 1.0 {
        format!("{ratio:.2}x faster")
    } else {
        format!("{:.2}x slower", 1.0 / ratio)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speeds_under_one_say_slower() {
        assert_eq!(speed_words(1.479), "1.48x faster");
        assert_eq!(speed_words(1.0 / 1.19), "1.19x slower");
        assert_eq!(speed_words(1.0), "1.00x faster");
        assert_eq!(speed_words(f64::NAN), "–");
    }
}
