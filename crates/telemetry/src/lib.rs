//! What every countersign binary sets up the same way: logging.
//!
//! Logs go to stderr, filtered by `RUST_LOG` (default `warn`, or `debug` when asked for),
//! as JSON lines when `RUST_LOG_FORMAT=json` so that a log shipper can read `run.id` and the
//! error codes as fields. This crate must never log anything itself, and must never decide
//! what a binary logs: that stays with the code that knows the event.

/// Installs the global subscriber. Call once, first thing in `main`.
pub fn init_tracing(verbose: bool) {
    let default = if verbose { "debug" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::env::var("RUST_LOG_FORMAT").is_ok_and(|f| f == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}
