//! From an agent configuration's `model` settings to a provider.
//!
//! A worker runs many segments of many runs; building an HTTP client (and its connection pool)
//! or re-reading a script for each of them would waste both. The catalog therefore keeps one
//! provider per distinct provider settings — never per run: providers hold no run state, so
//! any number of runs share one.
//!
//! Only the fields that choose a provider make up the cache key. The rest of the `model`
//! settings (`system_prompt`, `options`, …) belongs to the loop and is ignored here, so agents
//! that differ only in their prompt share one client.
//!
//! The API key is the value of the variable the settings name in `api_key_env`, asked of the
//! catalog's lookup (a binary passes its process environment) when the provider is first
//! built; the settings never hold a key, and a settings object that tries to is refused. A
//! rotated key is picked up by a new process (or a new catalog).
//!
//! [`ModelCatalog::check`] reads settings with the same parser, without building anything, so
//! that `countersign agents put` refuses what a worker would refuse before any run meets it,
//! and says what can only be known where the workers run (the key's variable, the script file).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use countersign_core::{DataClass, DataClasses, Model};
use secrecy::SecretString;
use serde_json::{Map, Value};
use strum::VariantArray;

use crate::openai::{endpoint, EndpointError, OpenAiCompatible, RetryPolicy, DEFAULT_TIMEOUT};
use crate::scripted::{ScriptError, ScriptedModel};

/// The providers the catalog knows, as settings name them.
const PROVIDERS: &str = "\"scripted\", \"openai\" (or \"openai_compatible\")";

/// Why the `model` settings of an agent configuration name no usable provider.
///
/// Messages name settings fields and environment variable names, never a key.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum ModelConfigError {
    #[error("the model settings name no provider: \"provider\" is one of {PROVIDERS}")]
    #[strum(serialize = "unknown_provider")]
    MissingProvider,
    #[error("unknown model provider {0:?}: \"provider\" is one of {PROVIDERS}")]
    UnknownProvider(String),
    #[error("the environment variable {0} that should hold the API key is not set or empty")]
    MissingApiKey(String),
    #[error("invalid model settings: {0}")]
    InvalidSettings(String),
    #[error("invalid model endpoint: {0}")]
    #[strum(serialize = "invalid_settings")]
    Endpoint(#[from] EndpointError),
    #[error("cannot load the model script {}: {source}", path.display())]
    ScriptUnreadable {
        path: PathBuf,
        #[source]
        source: ScriptError,
    },
}

impl ModelConfigError {
    /// A stable code for the database, events and metrics.
    pub fn code(&self) -> &'static str {
        self.into()
    }
}

/// The part of the `model` settings that chooses and builds a provider: the cache key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ProviderSettings {
    Scripted {
        /// `None`: the settings name none and the catalog has no default.
        script: Option<PathBuf>,
    },
    OpenAi {
        base_url: String,
        model: String,
        api_key_env: String,
        timeout: Duration,
        retry: RetryPolicy,
    },
}

/// What [`ModelCatalog::check`] found in settings it accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SettingsCheck {
    /// The provider, as the catalog names it: `scripted` or `openai`.
    pub provider: &'static str,
    /// What could not be checked here and must hold where the workers run, one sentence each.
    pub notes: Vec<String>,
}

/// The value of a variable that settings name (`api_key_env`); unset is `None`.
type Variables = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Builds and keeps the providers agent configurations name.
///
/// ```no_run
/// use countersign_model::ModelCatalog;
///
/// let environment = |name: &str| std::env::var(name).ok();
/// let catalog = ModelCatalog::new(environment).with_default_script("/etc/countersign/script.json");
/// let settings = serde_json::json!({
///     "provider": "openai",
///     "base_url": "https://api.openai.com/v1",
///     "model": "gpt-4o-mini",
///     "api_key_env": "OPENAI_API_KEY",
/// });
/// let model = catalog.model_for(&settings)?; // Arc<dyn Model>, shared with equal settings
/// # Ok::<(), countersign_model::ModelConfigError>(())
/// ```
pub struct ModelCatalog {
    default_script: Option<PathBuf>,
    variable: Variables,
    built: Mutex<HashMap<ProviderSettings, Arc<dyn Model>>>,
}

impl std::fmt::Debug for ModelCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelCatalog")
            .field("default_script", &self.default_script)
            .finish_non_exhaustive()
    }
}

impl ModelCatalog {
    /// A catalog whose providers take their API keys from `variable`, asked for the name the
    /// settings give in `api_key_env`.
    pub fn new(variable: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> Self {
        ModelCatalog {
            default_script: None,
            variable: Box::new(variable),
            built: Mutex::default(),
        }
    }

    /// The key in the variable `name`, when it holds one.
    fn key(&self, name: &str) -> Option<String> {
        (self.variable)(name).filter(|key| !key.trim().is_empty())
    }

    /// The script a `{"provider": "scripted"}` without a `script` path plays.
    pub fn with_default_script(mut self, path: impl Into<PathBuf>) -> Self {
        self.default_script = Some(path.into());
        self
    }

    /// The provider the `model` settings of an agent configuration name, built on first use
    /// and shared afterwards by every caller with the same provider settings.
    pub fn model_for(&self, settings: &Value) -> Result<Arc<dyn Model>, ModelConfigError> {
        let key = ProviderSettings::parse(settings, self.default_script.as_deref())?;
        let mut built = self.built.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(model) = built.get(&key) {
            return Ok(Arc::clone(model));
        }
        let model = key.build(|name| self.key(name))?;
        built.insert(key, Arc::clone(&model));
        Ok(model)
    }

    /// The data classes the provider `settings` name may be sent ([`DataClasses`]): every class
    /// for the scripted provider, which runs inside the installation; for a provider outside
    /// it, the classes its `data_classes` list names, or [`DataClasses::external_default`]
    /// (public data and editor content) without one. A name that is not a class is refused.
    pub fn data_classes(&self, settings: &Value) -> Result<DataClasses, ModelConfigError> {
        let key = ProviderSettings::parse(settings, self.default_script.as_deref())?;
        let listed = match settings.get("data_classes") {
            None | Some(Value::Null) => None,
            Some(Value::Array(names)) => Some(
                names
                    .iter()
                    .map(|n| {
                        n.as_str().and_then(|n| n.parse().ok()).ok_or_else(|| {
                            let known: Vec<&str> =
                                DataClass::VARIANTS.iter().map(|c| c.as_str()).collect();
                            ModelConfigError::InvalidSettings(format!(
                                "data_classes: {n} is not one of {}",
                                known.join(", ")
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(_) => return Err(invalid("data_classes is not a list of data class names")),
        };
        Ok(match (key, listed) {
            (_, Some(classes)) => DataClasses::of(classes),
            (ProviderSettings::Scripted { .. }, None) => DataClasses::all(),
            (ProviderSettings::OpenAi { .. }, None) => DataClasses::external_default(),
        })
    }

    /// Reads `settings` as [`model_for`](Self::model_for) does, building nothing and reading no
    /// key: an error is what every worker would refuse them for. What depends on the machine a
    /// worker runs on is not an error here but a note — the key's environment variable not set
    /// in this process, a script this process cannot read, no script named and no default.
    pub fn check(&self, settings: &Value) -> Result<SettingsCheck, ModelConfigError> {
        self.data_classes(settings)?;
        let mut notes = Vec::new();
        let provider = match ProviderSettings::parse(settings, self.default_script.as_deref())? {
            ProviderSettings::Scripted { script } => {
                match script {
                    None => notes.push(
                        "the settings name no script: a worker plays the script of its \
                         --model-script (COUNTERSIGN_MODEL_SCRIPT), and one started without \
                         fails the agent's runs provider_failed (invalid_settings)"
                            .to_owned(),
                    ),
                    Some(path) => match ScriptedModel::from_path(&path) {
                        Ok(_) => {}
                        Err(ScriptError::Read(e)) => notes.push(format!(
                            "the script {} cannot be read here ({e}): the workers must be able \
                             to read it, or they fail the agent's runs provider_failed \
                             (script_unreadable)",
                            path.display()
                        )),
                        Err(source) => {
                            return Err(ModelConfigError::ScriptUnreadable { path, source })
                        }
                    },
                }
                "scripted"
            }
            ProviderSettings::OpenAi { api_key_env, .. } => {
                if self.key(&api_key_env).is_none() {
                    notes.push(format!(
                        "the environment variable {api_key_env} is not set here: the workers \
                         read the API key from it, and one without it fails the agent's runs \
                         provider_failed (missing_api_key)"
                    ));
                }
                "openai"
            }
        };
        Ok(SettingsCheck { provider, notes })
    }
}

impl ProviderSettings {
    fn parse(settings: &Value, default_script: Option<&Path>) -> Result<Self, ModelConfigError> {
        let fields = settings
            .as_object()
            .ok_or_else(|| invalid("the model settings are not an object"))?;
        let provider = match fields.get("provider") {
            None | Some(Value::Null) => return Err(ModelConfigError::MissingProvider),
            Some(Value::String(name)) => name.as_str(),
            Some(_) => return Err(invalid("provider is not a string")),
        };
        match provider {
            "scripted" => {
                let script = optional_string(fields, "script")?
                    .map(PathBuf::from)
                    .or_else(|| default_script.map(Path::to_path_buf));
                Ok(ProviderSettings::Scripted { script })
            }
            "openai" | "openai_compatible" => {
                if fields.contains_key("api_key") {
                    return Err(invalid(
                        "api_key is refused: keys are never stored in settings, \
                         name the environment variable in api_key_env",
                    ));
                }
                let timeout = match fields.get("timeout_secs") {
                    None | Some(Value::Null) => DEFAULT_TIMEOUT,
                    Some(value) => match value.as_u64() {
                        Some(secs) if secs > 0 => Duration::from_secs(secs),
                        _ => return Err(invalid("timeout_secs is not a positive integer")),
                    },
                };
                let base_url = required_string(fields, "base_url")?;
                endpoint(&base_url)?;
                let api_key_env = optional_string(fields, "api_key_env")?.ok_or_else(|| {
                    invalid(
                        "api_key_env is missing: name the environment variable that holds \
                         the API key",
                    )
                })?;
                Ok(ProviderSettings::OpenAi {
                    base_url,
                    model: required_string(fields, "model")?,
                    api_key_env,
                    timeout,
                    retry: retry_policy(fields.get("retry"))?,
                })
            }
            other => Err(ModelConfigError::UnknownProvider(other.to_owned())),
        }
    }

    fn build(
        &self,
        key_of: impl Fn(&str) -> Option<String>,
    ) -> Result<Arc<dyn Model>, ModelConfigError> {
        match self {
            ProviderSettings::Scripted { script: None } => {
                Err(invalid("script is missing and there is no default"))
            }
            ProviderSettings::Scripted {
                script: Some(script),
            } => {
                let model = ScriptedModel::from_path(script).map_err(|source| {
                    ModelConfigError::ScriptUnreadable {
                        path: script.clone(),
                        source,
                    }
                })?;
                Ok(Arc::new(model))
            }
            ProviderSettings::OpenAi {
                base_url,
                model,
                api_key_env,
                timeout,
                retry,
            } => {
                let key = key_of(api_key_env)
                    .ok_or_else(|| ModelConfigError::MissingApiKey(api_key_env.clone()))?;
                let provider =
                    OpenAiCompatible::new(base_url, model.clone(), SecretString::from(key))?
                        .with_timeout(*timeout)
                        .with_retry(*retry);
                tracing::info!(endpoint = %provider.endpoint(), model = %model, "built a model provider");
                Ok(Arc::new(provider))
            }
        }
    }
}

/// The `retry` settings: absent fields keep their defaults, an unknown one is refused (a typo
/// would otherwise silently keep the default).
fn retry_policy(value: Option<&Value>) -> Result<RetryPolicy, ModelConfigError> {
    let mut policy = RetryPolicy::default();
    let fields = match value {
        None | Some(Value::Null) => return Ok(policy),
        Some(Value::Object(fields)) => fields,
        Some(_) => return Err(invalid("retry is not an object")),
    };
    let bounded = |name: &str, value: &Value, max: u64| match value.as_u64() {
        Some(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(ModelConfigError::InvalidSettings(format!(
            "retry.{name} is not a whole number from 1 to {max}"
        ))),
    };
    for (name, value) in fields {
        match name.as_str() {
            "max_attempts" => {
                let n = bounded(name, value, u64::from(RetryPolicy::MAX_ATTEMPTS))?;
                policy.max_attempts = u32::try_from(n).unwrap_or(RetryPolicy::MAX_ATTEMPTS);
            }
            "max_elapsed_secs" => {
                let secs = bounded(name, value, RetryPolicy::MAX_ELAPSED.as_secs())?;
                policy.max_elapsed = Duration::from_secs(secs);
            }
            other => {
                return Err(ModelConfigError::InvalidSettings(format!(
                    "retry.{other} is not a retry setting (max_attempts, max_elapsed_secs)"
                )))
            }
        }
    }
    Ok(policy)
}

fn invalid(reason: &str) -> ModelConfigError {
    ModelConfigError::InvalidSettings(reason.to_owned())
}

fn optional_string(
    fields: &Map<String, Value>,
    name: &str,
) -> Result<Option<String>, ModelConfigError> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) if !text.trim().is_empty() => Ok(Some(text.clone())),
        Some(_) => Err(ModelConfigError::InvalidSettings(format!(
            "{name} is not a non-empty string"
        ))),
    }
}

fn required_string(fields: &Map<String, Value>, name: &str) -> Result<String, ModelConfigError> {
    optional_string(fields, name)?
        .ok_or_else(|| ModelConfigError::InvalidSettings(format!("{name} is missing")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_config_error_has_the_code_it_always_had() {
        let errors = [
            (ModelConfigError::MissingProvider, "unknown_provider"),
            (
                ModelConfigError::UnknownProvider("claude".into()),
                "unknown_provider",
            ),
            (
                ModelConfigError::MissingApiKey("OPENAI_API_KEY".into()),
                "missing_api_key",
            ),
            (
                ModelConfigError::InvalidSettings("timeout_secs".into()),
                "invalid_settings",
            ),
            (
                ModelConfigError::Endpoint(EndpointError::InvalidUrl),
                "invalid_settings",
            ),
            (
                ModelConfigError::ScriptUnreadable {
                    path: PathBuf::from("script.json"),
                    source: ScriptError::Read(std::io::ErrorKind::NotFound.into()),
                },
                "script_unreadable",
            ),
        ];
        for (error, code) in errors {
            assert_eq!(error.code(), code, "{error:?}");
        }
    }
}
