//! What the CLI shows while commands run: progress bars, query results
//! with their statistics line, the SQL prompt.

use std::io::{BufRead, Write};
use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressStyle};
use insitu_host::{InsituHost, QueryStats};
use insitu_link::LinkProfile;
use insitu_session::Progress;

use crate::error::CliResult;
use crate::output::print_batches;
use crate::units::human_bytes;
use crate::Format;

/// Progress bars on stderr, one per phase of a job.
#[derive(Default)]
pub struct Bars {
    current: Mutex<Option<ProgressBar>>,
}

impl Progress for Bars {
    fn phase(&self, name: &str, total: Option<u64>) {
        let bar = match total {
            Some(total) => {
                let bar = ProgressBar::new(total);
                bar.set_style(
                    ProgressStyle::with_template(
                        "{msg:>10} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} rows ({per_sec}, eta {eta})",
                    )
                    .expect("progress template"),
                );
                bar
            }
            None => {
                let bar = ProgressBar::new_spinner();
                bar.set_style(
                    ProgressStyle::with_template("{spinner} {msg} {human_pos} rows ({per_sec})")
                        .expect("progress template"),
                );
                bar.enable_steady_tick(std::time::Duration::from_millis(200));
                bar
            }
        };
        bar.set_message(name.to_string());
        *self.current.lock().expect("progress lock") = Some(bar);
    }

    fn advance(&self, rows: u64) {
        if let Some(bar) = &*self.current.lock().expect("progress lock") {
            bar.inc(rows);
        }
    }

    fn done(&self) {
        if let Some(bar) = self.current.lock().expect("progress lock").take() {
            bar.finish();
        }
    }
}

/// Prints a note of the session library once per process.
pub fn print_note(note: &str) {
    static NOTED: std::sync::Once = std::sync::Once::new();
    NOTED.call_once(|| eprintln!("{note}"));
}

/// Runs blocking work off the async threads.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> CliResult<T> + Send + 'static,
) -> CliResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("task failed: {e}"))?
}

pub fn stats_footer(stats: &QueryStats, host: &InsituHost) -> String {
    let link = host
        .clients()
        .first()
        .map(|c| c.link().profile())
        .unwrap_or(LinkProfile::UNLIMITED);
    let mode = format!("pushdown {}", host.config().pushdown.name());
    format!(
        "{} rows in {:.3} s ({mode}, link {link}) | devices read {} rows, {} | link: {} to devices, {} to host | memory: {}",
        stats.result_rows,
        stats.wall_secs,
        stats.device_rows_read,
        human_bytes(stats.device_bytes_read),
        human_bytes(stats.link_bytes_to_device),
        human_bytes(stats.link_bytes_to_host),
        stats.memory_summary(),
    )
}

pub async fn run_and_print(host: &InsituHost, sql: &str, format: Format) -> CliResult<()> {
    let outcome = host.sql(sql).await.map_err(|e| e.to_string())?;
    print_batches(&outcome.schema, &outcome.batches, format)?;
    eprintln!("{}", stats_footer(&outcome.stats, host));
    Ok(())
}

/// Reads statements ending in `;` from stdin until EOF or `\q`.
pub async fn repl(host: &InsituHost, format: Format) -> CliResult<()> {
    let stdin = std::io::stdin();
    let mut buffer = String::new();
    eprintln!(
        "insitu SQL ({} tables). End statements with ';', quit with \\q or Ctrl-D.",
        host.tables().len()
    );
    loop {
        eprint!(
            "{}",
            if buffer.is_empty() {
                "insitu> "
            } else {
                "   ...> "
            }
        );
        let _ = std::io::stderr().flush();
        let mut line = String::new();
        if stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| e.to_string())?
            == 0
        {
            return Ok(());
        }
        if line.trim() == "\\q" {
            return Ok(());
        }
        buffer.push_str(&line);
        if line.trim_end().ends_with(';') {
            if let Err(e) = run_and_print(host, &buffer, format).await {
                eprintln!("error: {e}");
            }
            buffer.clear();
        }
    }
}
