//! Reading one object of config.json into a family's `#[derive(Deserialize)]` struct, the way
//! every family wants it: a `null` member is an absent one (transformers writes
//! `"rope_scaling": null` for "the default"), an error is one line naming the file and the
//! key path, and the keys no struct reads can be listed for a notice.

use anyhow::{anyhow, Result};
use serde::de::{self, DeserializeOwned, Visitor};
use serde::forward_to_deserialize_any;
use serde_json::{Map, Value};
use serde_path_to_error::Segment;
use std::collections::BTreeSet;

/// Deserializes `object`, found at key path `at` (empty for the file's top level) of the
/// file `origin`.
pub fn read<T: DeserializeOwned>(
    object: &Map<String, Value>,
    origin: &str,
    at: &[&str],
) -> Result<T> {
    let mut value = Value::Object(object.clone());
    drop_nulls(&mut value);
    serde_path_to_error::deserialize(value).map_err(|e| {
        let mut keys: Vec<String> = at.iter().map(|k| k.to_string()).collect();
        for segment in e.path().iter() {
            match segment {
                Segment::Map { key } => keys.push(key.clone()),
                Segment::Seq { index } => match keys.last_mut() {
                    Some(last) => *last = format!("{last}[{index}]"),
                    None => keys.push(format!("[{index}]")),
                },
                Segment::Enum { .. } | Segment::Unknown => {}
            }
        }
        anyhow!("{origin}: {}", describe(&keys, &e.into_inner().to_string()))
    })
}

/// "`leaf` of `parent.path`: problem", or "missing required key `name` in `parent`".
fn describe(keys: &[String], problem: &str) -> String {
    let parent = |keys: &[String], word: &str| match keys {
        [] => String::new(),
        _ => format!(" {word} `{}`", keys.join(".")),
    };
    // serde's wording for a required field the object lacks; the path is the object's.
    if let Some(field) = problem
        .strip_prefix("missing field `")
        .and_then(|rest| rest.strip_suffix('`'))
    {
        return format!("missing required key `{field}`{}", parent(keys, "in"));
    }
    match keys.split_last() {
        Some((leaf, rest)) => format!("`{leaf}`{}: {problem}", parent(rest, "of")),
        None => problem.to_string(),
    }
}

/// Removes every `null` member of every object in `value` (array entries stay).
fn drop_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// The keys of `object` that are neither fields of `T` nor in `ignored` (keys the family
/// knows and does not need), nor JSON comments (`_comment`). Not `deny_unknown_fields`: an
/// unknown field is a notice, not an error, and qwen4_exp's text config is read by two
/// families' structs, so a key is unknown only when neither reads it.
pub fn unread_keys<T: DeserializeOwned>(
    object: &Map<String, Value>,
    ignored: &[&str],
) -> BTreeSet<String> {
    let fields = field_names::<T>();
    object
        .keys()
        .filter(|k| !k.starts_with('_'))
        .filter(|k| !fields.contains(&k.as_str()) && !ignored.contains(&k.as_str()))
        .cloned()
        .collect()
}

/// The one-line notice for config fields nobody reads, if there are any.
pub fn unknown_fields_notice(origin: &str, family: &str, keys: &[String]) -> Option<String> {
    (!keys.is_empty()).then(|| {
        format!(
            "note: {origin}: ignoring {family} config fields this version does not know: {}",
            keys.join(", ")
        )
    })
}

/// The field names a derived `Deserialize` struct asks for: serde hands them to
/// `deserialize_struct`, which this deserializer records and then refuses.
fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut names: &'static [&'static str] = &[];
    let _ = T::deserialize(FieldNames(&mut names));
    names
}

struct FieldNames<'a>(&'a mut &'static [&'static str]);

#[derive(Debug)]
struct Recorded;

impl std::fmt::Display for Recorded {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("field names recorded")
    }
}

impl std::error::Error for Recorded {}

impl de::Error for Recorded {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Recorded
    }
}

impl<'de> de::Deserializer<'de> for FieldNames<'_> {
    type Error = Recorded;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Recorded> {
        Err(Recorded)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Recorded> {
        *self.0 = fields;
        Err(Recorded)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}
