//! The field names of a serde struct, as its derived `Deserialize` declares them: what a parser
//! that names the field it refused, or the fields it accepts, reads them from, so that no list
//! of names is kept beside the struct.

use serde::de::{self, DeserializeOwned, Deserializer, Visitor};

/// The names of `T`'s fields as serde reads them, in declaration order; empty for a type that
/// is not a struct.
pub fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut names: &'static [&'static str] = &[];
    // The deserializer only notes the names and then refuses; the refusal is expected.
    let _ = T::deserialize(FieldNames(&mut names));
    names
}

/// A deserializer that answers a struct's request with nothing but notes its field names.
struct FieldNames<'a>(&'a mut &'static [&'static str]);

impl<'de> Deserializer<'de> for FieldNames<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("only a struct has field names"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.0 = fields;
        Err(de::Error::custom("only the field names were asked for"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}
