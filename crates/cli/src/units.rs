//! Human-friendly sizes (`4GiB`, `512MiB`, `1.5GB`, `1000`; parsed by
//! the wire crate, whose configuration files take them too) and ratios.

pub use insitu_wire::units::{human_bytes, parse_bytes};

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
    fn link_reductions_under_one_say_more() {
        assert_eq!(link_reduction_words(1617.4), "1617x fewer");
        assert_eq!(link_reduction_words(1.547), "1.55x fewer");
        assert_eq!(link_reduction_words(85.40 / 140.83), "1.65x more");
        assert_eq!(link_reduction_words(0.0), "no link bytes to compare");
    }
}
