#![doc = include_str!("../README.md")]

mod catalog;
mod openai;
mod scripted;

pub use catalog::{ModelCatalog, ModelConfigError, SettingsCheck};
pub use openai::{EndpointError, OpenAiCompatible, RetryPolicy, DEFAULT_TIMEOUT};
pub use scripted::{Script, ScriptError, ScriptedCall, ScriptedModel, ScriptedTurn};
