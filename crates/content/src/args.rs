//! Argument validation, up front and all or nothing.
//!
//! The arguments are model-chosen. A call with an argument the tool does not know is refused
//! whole rather than half applied: a record half-written from a call the model got wrong is
//! harder to reason about than a refusal the model can correct. `null` counts as absent, so an
//! optional argument the model fills with `null` is simply not given.

use serde_json::{Map, Value};

/// A refusal of the arguments, in words the model can act on.
pub(crate) type ArgResult<T> = Result<T, String>;

/// The arguments of one call, after the object and unknown-argument checks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Args<'a> {
    map: &'a Map<String, Value>,
}

impl<'a> Args<'a> {
    /// Accepts a JSON object whose every key is in `accepted`; otherwise refuses the whole call.
    pub(crate) fn parse(value: &'a Value, accepted: &[&str]) -> ArgResult<Args<'a>> {
        let Some(map) = value.as_object() else {
            return Err("The arguments must be a JSON object; the whole call was refused.".into());
        };
        let unknown: Vec<&str> = map
            .keys()
            .map(String::as_str)
            .filter(|k| !accepted.contains(k))
            .collect();
        if !unknown.is_empty() {
            let quoted: Vec<String> = unknown.iter().map(|k| format!("\"{k}\"")).collect();
            return Err(format!(
                "Unknown argument(s) {}; the whole call was refused. Accepted arguments: {}.",
                quoted.join(", "),
                accepted.join(", ")
            ));
        }
        Ok(Args { map })
    }

    fn get(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    /// A required id: a positive integer (a string of decimal digits is accepted too).
    pub(crate) fn uid(&self, name: &str) -> ArgResult<i64> {
        self.opt_uid(name)?
            .ok_or_else(|| format!("The argument \"{name}\" is required."))
    }

    /// An optional id: a positive integer (a string of decimal digits is accepted too).
    pub(crate) fn opt_uid(&self, name: &str) -> ArgResult<Option<i64>> {
        self.opt_int(name, 1, i64::MAX)
    }

    /// An optional integer in `min..=max` (a string of decimal digits is accepted too).
    pub(crate) fn opt_int(&self, name: &str, min: i64, max: i64) -> ArgResult<Option<i64>> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let n = match v {
            Value::Number(n) => n.as_i64(),
            Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
                s.parse::<i64>().ok()
            }
            _ => None,
        };
        match n {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ if max == i64::MAX => Err(format!(
                "The argument \"{name}\" must be an integer of at least {min}."
            )),
            _ => Err(format!(
                "The argument \"{name}\" must be an integer from {min} to {max}."
            )),
        }
    }

    /// An optional boolean.
    pub(crate) fn opt_bool(&self, name: &str) -> ArgResult<Option<bool>> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(format!("The argument \"{name}\" must be true or false.")),
        }
    }

    /// An optional string of at most `cap` characters. `required` refuses an empty (or
    /// whitespace-only) value up front: the write path would drop it silently.
    pub(crate) fn opt_text(
        &self,
        name: &str,
        cap: usize,
        required: bool,
    ) -> ArgResult<Option<String>> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let Value::String(s) = v else {
            return Err(format!("The argument \"{name}\" must be a string."));
        };
        if required && s.trim().is_empty() {
            return Err(format!(
                "The argument \"{name}\" must not be empty; the whole call was refused."
            ));
        }
        if s.contains('\0') {
            return Err(format!(
                "The argument \"{name}\" must not contain a NUL character."
            ));
        }
        let len = s.chars().count();
        if len > cap {
            return Err(format!(
                "The argument \"{name}\" is {len} characters long; at most {cap} are accepted."
            ));
        }
        Ok(Some(s.clone()))
    }

    /// A required, non-empty string of at most `cap` characters.
    pub(crate) fn text(&self, name: &str, cap: usize) -> ArgResult<String> {
        self.opt_text(name, cap, true)?
            .ok_or_else(|| format!("The argument \"{name}\" is required."))
    }

    /// An optional string that must be one of `choices`.
    pub(crate) fn opt_choice(
        &self,
        name: &str,
        choices: &[&'static str],
    ) -> ArgResult<Option<&'static str>> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let found = v
            .as_str()
            .and_then(|s| choices.iter().copied().find(|c| *c == s));
        match found {
            Some(c) => Ok(Some(c)),
            None => Err(format!(
                "The argument \"{name}\" must be one of: {}.",
                choices.join(", ")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_unknown_argument_refuses_the_whole_call_and_names_it() {
        let v = json!({"uid": 12, "title": "x", "slug": "/x"});
        let err = Args::parse(&v, &["uid", "title"]).unwrap_err();
        assert!(err.contains("\"slug\""), "{err}");
        assert!(err.contains("whole call"), "{err}");
    }

    #[test]
    fn arguments_that_are_not_an_object_are_refused() {
        assert!(Args::parse(&json!([1]), &["uid"]).is_err());
    }

    #[test]
    fn an_id_is_a_positive_integer_or_a_string_of_digits() {
        let v = json!({"a": 12, "b": "13", "c": 0, "d": -1, "e": "1e2", "f": 1.5, "g": " 1"});
        let a = Args::parse(&v, &["a", "b", "c", "d", "e", "f", "g"]).unwrap();
        assert_eq!(a.uid("a").unwrap(), 12);
        assert_eq!(a.uid("b").unwrap(), 13);
        for bad in ["c", "d", "e", "f", "g"] {
            assert!(a.uid(bad).is_err(), "{bad}");
        }
        assert!(a.uid("missing").is_err());
    }

    #[test]
    fn null_counts_as_absent() {
        let v = json!({"column": null});
        let a = Args::parse(&v, &["column"]).unwrap();
        assert_eq!(a.opt_int("column", 0, 9).unwrap(), None);
    }

    #[test]
    fn a_required_text_refuses_empty_and_whitespace() {
        let v = json!({"a": "", "b": "  \n", "c": "ok"});
        let a = Args::parse(&v, &["a", "b", "c"]).unwrap();
        assert!(a.text("a", 10).is_err());
        assert!(a.text("b", 10).is_err());
        assert_eq!(a.text("c", 10).unwrap(), "ok");
        assert_eq!(a.opt_text("a", 10, false).unwrap(), Some(String::new()));
    }

    #[test]
    fn a_text_longer_than_its_cap_is_refused_counting_characters() {
        let v = json!({"a": "é".repeat(5)});
        let a = Args::parse(&v, &["a"]).unwrap();
        assert!(a.text("a", 5).is_ok());
        assert!(a.text("a", 4).unwrap_err().contains("5 characters"));
    }

    #[test]
    fn a_nul_character_is_refused() {
        let v = json!({"a": "x\u{0}y"});
        let a = Args::parse(&v, &["a"]).unwrap();
        assert!(a.text("a", 10).is_err());
    }
}
