//! The 22 TPC-H queries with their validation parameters.

use crate::error::CliResult;

pub const QUERIES: [&str; 22] = [
    include_str!("../../../queries/tpch/q1.sql"),
    include_str!("../../../queries/tpch/q2.sql"),
    include_str!("../../../queries/tpch/q3.sql"),
    include_str!("../../../queries/tpch/q4.sql"),
    include_str!("../../../queries/tpch/q5.sql"),
    include_str!("../../../queries/tpch/q6.sql"),
    include_str!("../../../queries/tpch/q7.sql"),
    include_str!("../../../queries/tpch/q8.sql"),
    include_str!("../../../queries/tpch/q9.sql"),
    include_str!("../../../queries/tpch/q10.sql"),
    include_str!("../../../queries/tpch/q11.sql"),
    include_str!("../../../queries/tpch/q12.sql"),
    include_str!("../../../queries/tpch/q13.sql"),
    include_str!("../../../queries/tpch/q14.sql"),
    include_str!("../../../queries/tpch/q15.sql"),
    include_str!("../../../queries/tpch/q16.sql"),
    include_str!("../../../queries/tpch/q17.sql"),
    include_str!("../../../queries/tpch/q18.sql"),
    include_str!("../../../queries/tpch/q19.sql"),
    include_str!("../../../queries/tpch/q20.sql"),
    include_str!("../../../queries/tpch/q21.sql"),
    include_str!("../../../queries/tpch/q22.sql"),
];

/// Query `n` (1-based), if it exists.
pub fn query(n: usize) -> Option<&'static str> {
    n.checked_sub(1).and_then(|i| QUERIES.get(i)).copied()
}

/// Parses a list like `1,6,14` or `all`.
pub fn parse_list(s: &str) -> CliResult<Vec<usize>> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok((1..=22).collect());
    }
    s.split(',')
        .map(|p| {
            let p = p.trim().trim_start_matches(['q', 'Q']);
            match p.parse::<usize>() {
                Ok(n) if (1..=22).contains(&n) => Ok(n),
                _ => Err(format!("'{p}' is not a TPC-H query number (1-22)").into()),
            }
        })
        .collect()
}
