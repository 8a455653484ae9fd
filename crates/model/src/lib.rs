//! Model providers for countersign, and the catalog that picks one for an agent configuration.
//!
//! - [`ScriptedModel`]: deterministic turns from a script; the demo and the end-to-end tests
//!   run it.
//! - [`OpenAiCompatible`]: an OpenAI-compatible Chat Completions API over HTTP.
//! - [`ModelCatalog`]: turns the `model` settings of an agent configuration into a shared
//!   `Arc<dyn Model>`, one per distinct provider settings.
//!
//! A worker keeps one catalog and asks it for the model of each segment:
//!
//! ```no_run
//! # fn segment(agent_model_settings: &serde_json::Value) -> Result<(), countersign_model::ModelConfigError> {
//! use countersign_model::ModelCatalog;
//!
//! let catalog = ModelCatalog::new().with_default_script("deploy/script.json");
//! let model = catalog.model_for(agent_model_settings)?; // err.code() for the run's record
//! # Ok(()) }
//! ```
//!
//! Settings, one object per agent configuration (other fields, such as `system_prompt` and
//! `options`, are the loop's and are ignored here):
//!
//! ```jsonc
//! { "provider": "scripted", "script": "/path/to/script.json" }   // script: else the default
//! { "provider": "openai",                                        // or "openai_compatible"
//!   "base_url": "https://api.openai.com/v1", "model": "gpt-4o-mini",
//!   "api_key_env": "OPENAI_API_KEY",                             // the variable's NAME
//!   "timeout_secs": 60,                                          // optional, default 60
//!   "retry": { "max_attempts": 4, "max_elapsed_secs": 60 } }     // optional, these defaults
//! ```
//!
//! [`ModelCatalog::check`] reads settings with the same parser without building anything:
//! what `countersign agents put` runs before it stores an agent.
//!
//! # Transport and TLS
//!
//! The HTTP client is `hyper` 1 with `hyper-util`'s pooled client, which the workspace already
//! builds for its HTTP surfaces. `https://` comes from the `tls` feature, on by default:
//! `hyper-rustls` with `rustls` on `ring` and the Mozilla roots from `webpki-roots` (no
//! OpenSSL, no system certificate store). It costs about 7 s on a clean two-core build and
//! nothing on an incremental one. Without the feature an `https://` base URL is refused when
//! the provider is built (`invalid_settings`), never at the first call.
//!
//! # What a provider must never do
//!
//! - **Store or log a key.** Keys come from the environment variable the settings name, live
//!   in a [`secrecy::SecretString`] and a header marked sensitive, and are redacted from
//!   anything logged of a provider's answer. No error text carries the key or the prompt.
//! - **Keep per-run state.** Everything a run needs travels in the request, because any worker
//!   may run the next segment. Providers are shared by every run with the same settings.
//! - **Fail a run on a bad minute.** Rate limits (429), server trouble (5xx) and broken
//!   connections are tried again under the agent's [`RetryPolicy`], honouring `Retry-After`,
//!   before the call fails `provider_unavailable`; the policy bounds both the attempts and the
//!   time, because the run holds its lease all the while.
//! - **Let a provider's answer crash a run.** Every malformed answer is a
//!   [`ModelError`](countersign_core::ModelError) with a stable code (`provider_unavailable`,
//!   `provider_invalid_response`); arguments that are not JSON are passed on as a JSON string,
//!   which the loop refuses like any argument that is not an object.

mod catalog;
mod openai;
mod scripted;

pub use catalog::{ModelCatalog, ModelConfigError, SettingsCheck};
pub use openai::{EndpointError, OpenAiCompatible, RetryPolicy, DEFAULT_TIMEOUT};
pub use scripted::{Script, ScriptError, ScriptedCall, ScriptedModel, ScriptedTurn};
