//! Printing results as a table, CSV or JSON.

use std::io::Write;

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;

use crate::error::CliResult;
use crate::Format;

pub fn print_batches(schema: &SchemaRef, batches: &[RecordBatch], format: Format) -> CliResult<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let err = |e: &dyn std::fmt::Display| format!("cannot print results: {e}");
    match format {
        Format::Table => {
            let text =
                arrow::util::pretty::pretty_format_batches_with_schema(schema.clone(), batches)
                    .map_err(|e| err(&e))?;
            writeln!(out, "{text}").map_err(|e| err(&e))?;
        }
        Format::Csv => {
            let mut w = arrow::csv::WriterBuilder::new()
                .with_header(true)
                .build(&mut out);
            if batches.is_empty() {
                w.write(&RecordBatch::new_empty(schema.clone()))
                    .map_err(|e| err(&e))?;
            }
            for b in batches {
                w.write(b).map_err(|e| err(&e))?;
            }
        }
        Format::Json => {
            let mut w = arrow::json::ArrayWriter::new(&mut out);
            for b in batches {
                w.write(b).map_err(|e| err(&e))?;
            }
            w.finish().map_err(|e| err(&e))?;
            if batches.is_empty() {
                write!(out, "[]").map_err(|e| err(&e))?;
            }
            writeln!(out).map_err(|e| err(&e))?;
        }
    }
    Ok(())
}
