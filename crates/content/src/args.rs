//! Arguments: one struct per tool, parsed up front and all or nothing, and described to the
//! model by a JSON Schema derived from that same struct.
//!
//! The arguments are model-chosen. A call with an argument the tool does not know is refused
//! whole rather than half applied: a record half-written from a call the model got wrong is
//! harder to reason about than a refusal the model can correct. `null` counts as absent, so an
//! optional argument the model fills with `null` is simply not given.
//!
//! A tool's arguments are a `#[derive(Deserialize, JsonSchema)]` struct with
//! `#[serde(deny_unknown_fields)]`, whose fields are the types of this module (or `Option`s of
//! them). Each type refuses a bad value in words the model can act on, and states the same rule
//! in its schema, so the parameters a tool's spec shows the model ([`parameters`]) admit exactly
//! what [`parse`] accepts — the schema cannot drift from the parser because neither is written
//! by hand. Two rules no schema states are the parser's alone, each named where it is checked:
//! a NUL character, refused by the text types (PostgreSQL cannot store one, and a pattern on
//! every string to say so would be noise to the model), and rules across arguments ("at least
//! one of"), in [`Arguments::check`] (the top-level `anyOf` that would state them is refused by
//! the provider APIs). `tests/it/schemas.rs` holds every registered tool's schema and parser to
//! the same examples.

use std::any::TypeId;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use countersign_core::fields::field_names;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, DeserializeOwned, Deserializer};
use serde::Deserialize;
use serde_json::{Map, Value};

/// A refusal of the arguments, in words the model can act on.
pub(crate) type ArgResult<T> = Result<T, String>;

/// One tool's arguments.
pub(crate) trait Arguments: DeserializeOwned + JsonSchema + Send + Sync + 'static {
    /// A rule across arguments that the schema does not state, checked once every argument
    /// parsed.
    fn check(&self) -> ArgResult<()> {
        Ok(())
    }
}

/// The JSON Schema of `A`, as a tool spec's `parameters`: no `$schema`, and no title or
/// description (the tool's own description is the model's).
pub(crate) fn parameters<A: Arguments>() -> Value {
    let mut settings = schemars::generate::SchemaSettings::draft2020_12();
    settings.meta_schema = None;
    let mut schema = settings.into_generator().into_root_schema_for::<A>();
    schema.remove("title");
    schema.remove("description");
    schema.to_value()
}

/// Parses a call's arguments into `A`, or refuses the whole call.
pub(crate) fn parse<A: Arguments>(value: &Value) -> ArgResult<A> {
    let Some(map) = value.as_object() else {
        return Err("The arguments must be a JSON object; the whole call was refused.".into());
    };
    let accepted = field_names::<A>();
    let unknown: Vec<String> = map
        .keys()
        .filter(|k| !accepted.contains(&k.as_str()))
        .map(|k| format!("\"{k}\""))
        .collect();
    if !unknown.is_empty() {
        return Err(format!(
            "Unknown argument(s) {}; the whole call was refused. Accepted arguments: {}.",
            unknown.join(", "),
            accepted.join(", ")
        ));
    }
    let given: Map<String, Value> = map
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // Required is what the schema says is required: serde's own word for a missing field is
    // not one to show the model.
    if let Some(missing) = required::<A>()
        .iter()
        .find(|name| !given.contains_key(name.as_str()))
    {
        return Err(format!("The argument \"{missing}\" is required."));
    }
    let args: A = serde_path_to_error::deserialize(Value::Object(given)).map_err(|e| {
        match e.path().iter().next() {
            Some(serde_path_to_error::Segment::Map { key }) => {
                format!("The argument \"{key}\" {}", e.inner())
            }
            // Not reached: the object, unknown and missing arguments are refused above.
            _ => format!("The arguments were refused: {}", e.inner()),
        }
    })?;
    args.check()?;
    Ok(args)
}

/// The arguments [`parameters`] marks required for `A`, derived once per type: deriving the
/// schema allocates it whole, and every call's arguments are parsed more than once a turn.
fn required<A: Arguments>() -> Arc<[String]> {
    type Cache = RwLock<HashMap<TypeId, Arc<[String]>>>;
    static REQUIRED: OnceLock<Cache> = OnceLock::new();
    let cache = REQUIRED.get_or_init(Cache::default);
    let key = TypeId::of::<A>();
    if let Some(names) = cache.read().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return names.clone();
    }
    let schema = parameters::<A>();
    let names: Arc<[String]> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    cache
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .entry(key)
        .or_insert(names)
        .clone()
}

/// An integer-valued JSON number (`12` or `12.0`, as JSON Schema's `integer` has it) that fits
/// an `i64`.
pub(crate) fn integer(value: &Value) -> Option<i64> {
    let n = value.as_number()?;
    n.as_i64().or_else(|| {
        // 2^63: every integral f64 below it (and at or above -2^63) is an i64.
        const LIMIT: f64 = 9_223_372_036_854_775_808.0;
        n.as_f64()
            .filter(|f| f.fract() == 0.0 && (-LIMIT..LIMIT).contains(f))
            .map(|f| f as i64)
    })
}

/// Implements `Deserialize` through `TryFrom<Value>` (its error is the rest of the sentence
/// `The argument "x" …`) and an inlined `JsonSchema`.
macro_rules! argument_type {
    (impl[$($generics:tt)*] $ty:ty, $name:expr, $schema:expr) => {
        impl<'de, $($generics)*> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let value = Value::deserialize(d)?;
                <$ty>::try_from(value).map_err(de::Error::custom)
            }
        }

        impl<$($generics)*> JsonSchema for $ty {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> Cow<'static, str> {
                $name
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                $schema
            }
        }
    };
}

/// A record id: a positive integer; a string of decimal digits (`"12"`) is accepted too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Uid(i64);

impl Uid {
    /// Digits in a string id: 18 of them always fit an `i64`, which the schema can say.
    const MAX_DIGITS: usize = 18;

    pub(crate) fn get(self) -> i64 {
        self.0
    }
}

impl TryFrom<Value> for Uid {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        let n = match &value {
            Value::String(s)
                if !s.is_empty()
                    && s.len() <= Uid::MAX_DIGITS
                    && s.bytes().all(|b| b.is_ascii_digit()) =>
            {
                s.parse::<i64>().ok()
            }
            other => integer(other),
        };
        match n {
            Some(n) if n >= 1 => Ok(Uid(n)),
            _ => Err("must be an integer of at least 1.".into()),
        }
    }
}

argument_type!(impl[] Uid, "Uid".into(), json_schema!({
    "type": ["integer", "string"],
    "minimum": 1,
    "maximum": i64::MAX,
    // A string holds at least one digit that is not 0, and nothing but digits.
    "pattern": "^[0-9]*[1-9][0-9]*$",
    "maxLength": Uid::MAX_DIGITS,
}));

/// An integer from `MIN` to `MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Int<const MIN: i64, const MAX: i64>(i64);

impl<const MIN: i64, const MAX: i64> Int<MIN, MAX> {
    pub(crate) fn get(self) -> i64 {
        self.0
    }
}

impl<const MIN: i64, const MAX: i64> TryFrom<Value> for Int<MIN, MAX> {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        match integer(&value) {
            Some(n) if (MIN..=MAX).contains(&n) => Ok(Int(n)),
            _ => Err(format!("must be an integer from {MIN} to {MAX}.")),
        }
    }
}

argument_type!(
    impl[const MIN: i64, const MAX: i64] Int<MIN, MAX>,
    format!("Int_{MIN}_{MAX}").into(),
    json_schema!({"type": "integer", "minimum": MIN, "maximum": MAX})
);

/// `true` or `false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flag(bool);

impl Flag {
    pub(crate) fn get(self) -> bool {
        self.0
    }
}

impl TryFrom<Value> for Flag {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        value
            .as_bool()
            .map(Flag)
            .ok_or_else(|| "must be true or false.".into())
    }
}

argument_type!(impl[] Flag, "Flag".into(), json_schema!({"type": "boolean"}));

/// A string of at most `CAP` characters, which may be empty (`""` clears a field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Text<const CAP: usize>(String);

impl<const CAP: usize> Text<CAP> {
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

/// A string, without NUL, of at most `cap` characters.
fn text(value: Value, cap: usize, non_blank: bool) -> Result<String, String> {
    let Value::String(s) = value else {
        return Err("must be a string.".into());
    };
    // A blank value is refused up front: the write path would drop it silently.
    if non_blank && s.trim().is_empty() {
        return Err("must not be empty; the whole call was refused.".into());
    }
    // The parser's alone (see the module doc): PostgreSQL cannot store a NUL.
    if s.contains('\0') {
        return Err("must not contain a NUL character.".into());
    }
    let len = s.chars().count();
    if len > cap {
        return Err(format!(
            "is {len} characters long; at most {cap} are accepted."
        ));
    }
    Ok(s)
}

impl<const CAP: usize> TryFrom<Value> for Text<CAP> {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        text(value, CAP, false).map(Text)
    }
}

argument_type!(
    impl[const CAP: usize] Text<CAP>,
    format!("Text_{CAP}").into(),
    json_schema!({"type": "string", "maxLength": CAP})
);

/// A string of at most `CAP` characters that is not empty or whitespace only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NonBlank<const CAP: usize>(String);

impl<const CAP: usize> NonBlank<CAP> {
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl<const CAP: usize> TryFrom<Value> for NonBlank<CAP> {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        text(value, CAP, true).map(NonBlank)
    }
}

argument_type!(
    impl[const CAP: usize] NonBlank<CAP>,
    format!("NonBlank_{CAP}").into(),
    // `\S`: at least one character that is not whitespace.
    json_schema!({"type": "string", "minLength": 1, "maxLength": CAP, "pattern": "\\S"})
);

/// A closed set of words an argument may take, in the order the model is shown them.
pub(crate) trait Choice: Copy + PartialEq + Sized + 'static {
    const CHOICES: &'static [(&'static str, Self)];

    fn as_str(self) -> &'static str {
        Self::CHOICES
            .iter()
            .find(|(_, c)| *c == self)
            .map_or("", |(word, _)| word)
    }
}

/// The choice `value` names.
pub(crate) fn choose<C: Choice>(value: &Value) -> Result<C, String> {
    value
        .as_str()
        .and_then(|s| C::CHOICES.iter().find(|(word, _)| *word == s))
        .map(|(_, c)| *c)
        .ok_or_else(|| format!("must be one of: {}.", words::<C>().join(", ")))
}

fn words<C: Choice>() -> Vec<&'static str> {
    C::CHOICES.iter().map(|(word, _)| *word).collect()
}

/// The schema of a [`Choice`].
pub(crate) fn choice_schema<C: Choice>() -> Schema {
    json_schema!({"type": "string", "enum": words::<C>()})
}

/// Declares an enum as a [`Choice`] argument: `choice! { pub(crate) enum Table { Pages =
/// "pages", Content = "content" } }`.
macro_rules! choice {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($variant:ident = $word:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis enum $name {
            $($variant),+
        }

        impl $crate::args::Choice for $name {
            const CHOICES: &'static [(&'static str, Self)] = &[$(($word, $name::$variant)),+];
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let value = <::serde_json::Value as ::serde::Deserialize>::deserialize(d)?;
                $crate::args::choose(&value).map_err(::serde::de::Error::custom)
            }
        }

        impl ::schemars::JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> ::std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut ::schemars::SchemaGenerator) -> ::schemars::Schema {
                $crate::args::choice_schema::<Self>()
            }
        }
    };
}
pub(crate) use choice;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Sample {
        uid: Uid,
        column: Option<Int<0, 9>>,
        title: Option<NonBlank<5>>,
        note: Option<Text<5>>,
        flag: Option<Flag>,
    }

    impl Arguments for Sample {}

    fn refusal(v: Value) -> String {
        parse::<Sample>(&v).unwrap_err()
    }

    #[test]
    fn an_unknown_argument_refuses_the_whole_call_and_names_it_and_the_accepted_ones() {
        let err = refusal(json!({"uid": 12, "title": "x", "slug": "/x"}));
        assert_eq!(
            err,
            "Unknown argument(s) \"slug\"; the whole call was refused. Accepted arguments: uid, \
             column, title, note, flag."
        );
    }

    #[test]
    fn arguments_that_are_not_an_object_are_refused() {
        assert!(refusal(json!([1])).contains("JSON object"));
    }

    #[test]
    fn an_id_is_a_positive_integer_or_a_string_of_digits() {
        for (v, uid) in [(json!(12), 12), (json!("13"), 13), (json!(14.0), 14)] {
            let args = parse::<Sample>(&json!({"uid": v})).unwrap();
            assert_eq!(args.uid.get(), uid);
        }
        for bad in [
            json!(0),
            json!(-1),
            json!("1e2"),
            json!(1.5),
            json!(" 1"),
            json!("0"),
            json!(""),
            json!("1234567890123456789"),
            json!(9_223_372_036_854_775_808u64),
            json!(true),
        ] {
            assert_eq!(
                refusal(json!({"uid": bad})),
                "The argument \"uid\" must be an integer of at least 1.",
                "{bad}"
            );
        }
        assert_eq!(refusal(json!({})), "The argument \"uid\" is required.");
    }

    #[test]
    fn null_counts_as_absent() {
        let args = parse::<Sample>(&json!({"uid": 1, "column": null})).unwrap();
        assert_eq!(args.column, None);
        assert_eq!(
            refusal(json!({"uid": null})),
            "The argument \"uid\" is required."
        );
    }

    #[test]
    fn an_integer_out_of_its_range_is_refused_with_the_range() {
        assert_eq!(
            refusal(json!({"uid": 1, "column": 10})),
            "The argument \"column\" must be an integer from 0 to 9."
        );
        assert_eq!(
            refusal(json!({"uid": 1, "column": "3"})),
            "The argument \"column\" must be an integer from 0 to 9."
        );
    }

    #[test]
    fn a_non_blank_text_refuses_empty_and_whitespace_and_a_text_does_not() {
        for blank in ["", "  \n"] {
            assert_eq!(
                refusal(json!({"uid": 1, "title": blank})),
                "The argument \"title\" must not be empty; the whole call was refused."
            );
        }
        let args = parse::<Sample>(&json!({"uid": 1, "title": " a ", "note": ""})).unwrap();
        assert_eq!(args.title.unwrap().as_str(), " a ");
        assert_eq!(args.note.unwrap().as_str(), "");
    }

    #[test]
    fn a_text_longer_than_its_cap_is_refused_counting_characters() {
        assert!(parse::<Sample>(&json!({"uid": 1, "note": "é".repeat(5)})).is_ok());
        assert_eq!(
            refusal(json!({"uid": 1, "note": "é".repeat(6)})),
            "The argument \"note\" is 6 characters long; at most 5 are accepted."
        );
    }

    #[test]
    fn a_nul_character_is_refused() {
        assert_eq!(
            refusal(json!({"uid": 1, "note": "x\u{0}y"})),
            "The argument \"note\" must not contain a NUL character."
        );
    }

    #[test]
    fn a_wrong_type_is_refused_in_the_arguments_words_not_serdes() {
        let args = parse::<Sample>(&json!({"uid": 1, "flag": true})).unwrap();
        assert_eq!(args.flag.map(Flag::get), Some(true));
        assert_eq!(
            refusal(json!({"uid": 1, "flag": "yes"})),
            "The argument \"flag\" must be true or false."
        );
        assert_eq!(
            refusal(json!({"uid": 1, "note": 5})),
            "The argument \"note\" must be a string."
        );
    }

    #[test]
    fn the_schema_is_the_structs() {
        assert_eq!(
            parameters::<Sample>(),
            json!({
                "type": "object",
                "properties": {
                    "uid": {
                        "type": ["integer", "string"], "minimum": 1, "maximum": i64::MAX,
                        "pattern": "^[0-9]*[1-9][0-9]*$", "maxLength": 18,
                    },
                    "column": {"type": ["integer", "null"], "minimum": 0, "maximum": 9},
                    "title": {
                        "type": ["string", "null"], "minLength": 1, "maxLength": 5,
                        "pattern": "\\S",
                    },
                    "note": {"type": ["string", "null"], "maxLength": 5},
                    "flag": {"type": ["boolean", "null"]},
                },
                "required": ["uid"],
                "additionalProperties": false,
            })
        );
    }
}
