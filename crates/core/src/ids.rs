//! Identifiers parsed once at the edge, so the rest of the code never re-checks them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// Why an identifier was rejected. Codes are stable; they may be stored or published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
#[strum(prefix = "invalid_", serialize_all = "snake_case")]
#[non_exhaustive]
pub enum IdError {
    #[error("run id is not a UUID version 7")]
    RunId,
    #[error("turn digest is not 64 lowercase hex characters")]
    TurnDigest,
    #[error("suspension number must be a positive integer")]
    SuspensionSeq,
    #[error("lease epoch must be a non-negative integer")]
    LeaseEpoch,
    #[error("call index must be a non-negative integer")]
    CallIndex,
}

impl IdError {
    /// The stable code of this error.
    pub fn code(&self) -> &'static str {
        self.into()
    }
}

/// The id of a run: a UUID version 7, so ids sort by creation time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct RunId(Uuid);

impl RunId {
    /// A new, time-ordered run id.
    pub fn new() -> Self {
        RunId(Uuid::now_v7())
    }

    /// Accepts only a version-7 UUID.
    pub fn parse(s: &str) -> Result<Self, IdError> {
        let uuid = Uuid::parse_str(s).map_err(|_| IdError::RunId)?;
        Self::from_uuid(uuid)
    }

    /// Accepts only a version-7 UUID.
    pub fn from_uuid(uuid: Uuid) -> Result<Self, IdError> {
        if uuid.get_version_num() == 7 {
            Ok(RunId(uuid))
        } else {
            Err(IdError::RunId)
        }
    }

    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl Default for RunId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for RunId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl<'de> Deserialize<'de> for RunId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        RunId::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// SHA-256 of the canonical JSON of a turn's pending calls, as 64 lowercase hex characters.
/// See [`crate::digest`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct TurnDigest(String);

impl TurnDigest {
    pub fn parse(s: &str) -> Result<Self, IdError> {
        let ok = s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if ok {
            Ok(TurnDigest(s.to_owned()))
        } else {
            Err(IdError::TurnDigest)
        }
    }

    pub(crate) fn from_bytes(bytes: &[u8]) -> Self {
        TurnDigest(hex::encode(bytes))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TurnDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for TurnDigest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        TurnDigest::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The number of a suspension within its run: 1 for the first card, +1 for every later one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct SuspensionSeq(u32);

impl SuspensionSeq {
    pub const FIRST: SuspensionSeq = SuspensionSeq(1);

    pub fn new(n: u32) -> Result<Self, IdError> {
        if n >= 1 {
            Ok(SuspensionSeq(n))
        } else {
            Err(IdError::SuspensionSeq)
        }
    }

    /// From a database integer column.
    pub fn from_i32(n: i32) -> Result<Self, IdError> {
        u32::try_from(n)
            .map_err(|_| IdError::SuspensionSeq)
            .and_then(Self::new)
    }

    pub fn get(self) -> u32 {
        self.0
    }

    pub fn as_i32(self) -> i32 {
        i32::try_from(self.0).unwrap_or(i32::MAX)
    }

    pub fn next(self) -> Self {
        SuspensionSeq(self.0.saturating_add(1))
    }
}

impl fmt::Display for SuspensionSeq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de> Deserialize<'de> for SuspensionSeq {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u32::deserialize(d)?;
        SuspensionSeq::new(n).map_err(serde::de::Error::custom)
    }
}

/// The fencing token of a lease: +1 on every claim of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseEpoch(i64);

impl LeaseEpoch {
    pub fn new(n: i64) -> Result<Self, IdError> {
        if n >= 0 {
            Ok(LeaseEpoch(n))
        } else {
            Err(IdError::LeaseEpoch)
        }
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for LeaseEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The position of a call within its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CallIndex(usize);

impl CallIndex {
    pub fn new(n: usize) -> Self {
        CallIndex(n)
    }

    pub fn get(self) -> usize {
        self.0
    }

    /// From a database integer column.
    pub fn from_i32(n: i32) -> Result<Self, IdError> {
        usize::try_from(n)
            .map(CallIndex)
            .map_err(|_| IdError::CallIndex)
    }

    pub fn as_i32(self) -> i32 {
        i32::try_from(self.0).unwrap_or(i32::MAX)
    }

    /// Parses a stored index: a non-negative JSON integer, or a string of decimal digits only.
    /// `0.9`, `"1e2"`, `" 0"`, `true` and `null` are not indexes.
    pub fn from_json(v: &Value) -> Result<Self, IdError> {
        match v {
            Value::Number(n) => n
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(CallIndex)
                .ok_or(IdError::CallIndex),
            Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s
                .parse::<usize>()
                .map(CallIndex)
                .map_err(|_| IdError::CallIndex),
            _ => Err(IdError::CallIndex),
        }
    }
}

impl fmt::Display for CallIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_run_id_must_be_uuid_version_7() {
        assert!(RunId::parse(&RunId::new().to_string()).is_ok());
        assert_eq!(
            RunId::parse("67e55044-10b1-426f-9247-bb680e5fe0c8"),
            Err(IdError::RunId)
        );
        assert_eq!(RunId::parse("not a uuid"), Err(IdError::RunId));
    }

    #[test]
    fn a_turn_digest_is_64_lowercase_hex() {
        assert!(TurnDigest::parse(&"a".repeat(64)).is_ok());
        assert!(TurnDigest::parse(&"A".repeat(64)).is_err());
        assert!(TurnDigest::parse(&"a".repeat(63)).is_err());
        assert!(TurnDigest::parse(&"g".repeat(64)).is_err());
    }

    #[test]
    fn suspension_numbers_start_at_one() {
        assert!(SuspensionSeq::new(0).is_err());
        assert_eq!(SuspensionSeq::FIRST.next().get(), 2);
        assert!(SuspensionSeq::from_i32(-1).is_err());
    }

    #[test]
    fn a_call_index_is_a_non_negative_integer_or_a_digit_string() {
        assert_eq!(CallIndex::from_json(&json!(0)), Ok(CallIndex(0)));
        assert_eq!(CallIndex::from_json(&json!("12")), Ok(CallIndex(12)));
        for bad in [
            json!(0.9),
            json!("1e2"),
            json!(" 0"),
            json!(true),
            json!(null),
            json!(-1),
            json!(""),
            json!(1.0),
        ] {
            assert_eq!(CallIndex::from_json(&bad), Err(IdError::CallIndex), "{bad}");
        }
    }
}
