//! [`PlacementChoice`]: what the placement rule weighed for one scan and
//! what it chose. A scan carries it (for `EXPLAIN` and statistics) and the
//! rule makes it; it lives apart from both so neither depends on the other.

use std::fmt;

use insitu_model::{Machine, Placement, Prediction, ResultEncoding, StageShape};
use insitu_wire::ResultCodec;

/// The candidates the rule weighed for one scan, and what it chose.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacementChoice {
    pub chosen: Placement,
    /// How the devices encode a pushed stage's results.
    pub codec: ResultCodec,
    pub candidates: Vec<Prediction>,
    /// What the model was given, so that `insitu simulate` can project
    /// the stage to other machines.
    pub shape: StageShape,
    pub machine: Machine,
}

impl PlacementChoice {
    /// The choice of `best` among `candidates`: its placement and its
    /// results' codec. `shape` keeps the chosen encoding, for `insitu
    /// simulate`.
    pub(crate) fn of(
        best: Prediction,
        candidates: Vec<Prediction>,
        shape: StageShape,
        machine: Machine,
    ) -> Self {
        let shape = shape.with_encoding(ResultEncoding {
            codec: best.codec,
            bytes_ratio: best.result_bytes_ratio,
        });
        Self {
            chosen: best.placement,
            codec: best.codec,
            candidates,
            shape,
            machine,
        }
    }

    /// Predicted seconds of the chosen placement.
    pub fn chosen_secs(&self) -> f64 {
        self.candidates
            .iter()
            .find(|p| p.placement == self.chosen && p.codec == self.codec)
            .map_or(0.0, |p| p.total_secs)
    }
}

impl fmt::Display for PlacementChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "placement={}", self.chosen)?;
        if self.chosen != Placement::Pull && self.codec != ResultCodec::None {
            write!(f, ", results={}", self.codec.name())?;
        }
        f.write_str(" (predicted")?;
        for (i, p) in self.candidates.iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            let encoding = if p.compressed() {
                format!(" {}", p.codec.name())
            } else {
                String::new()
            };
            write!(
                f,
                "{sep}{}{encoding}: {} ms, {} link bytes",
                p.placement,
                format_ms(p.total_secs),
                p.link_bytes.round() as u64
            )?;
        }
        f.write_str(")")
    }
}

fn format_ms(secs: f64) -> String {
    let ms = secs * 1e3;
    if ms < 10.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.0}")
    }
}
