//! Descriptor `metadata`: what a config attaches to a descriptor, as the protobuf `Struct` that
//! envoyproxy/ratelimit returns in a response's dynamic metadata (`RESPONSE_DYNAMIC_METADATA`),
//! with the conversions from and to JSON values and the merge of several descriptors' metadata.
//!
//! Why JSON values in between: the YAML file's `metadata` is any mapping, which serde reads as
//! JSON values; an xDS resource brings a `Struct`, taken through the same values so that both
//! sources compile to the same thing (a number that is not finite becomes null on the way, as
//! JSON has none); the `/json` face prints a `Struct` back as JSON. The conversions are the
//! protobuf JSON mapping of `google.protobuf.Value`, a few lines each, written here because the
//! crates that offer them replace `prost_types` with types of their own.

use std::sync::Arc;

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};
use serde_json::{Map, Value as Json};

/// A descriptor's metadata, compiled once and shared by every response that carries it.
#[derive(Debug, Clone, PartialEq)]
pub struct Metadata(pub Arc<Struct>);

/// Its numbers are finite (JSON has no other), so equality is an equivalence.
impl Eq for Metadata {}

impl Metadata {
    /// `None` for an empty mapping: envoyproxy/ratelimit attaches no metadata then.
    pub fn from_json(map: Map<String, Json>) -> Option<Metadata> {
        (!map.is_empty()).then(|| Metadata(Arc::new(struct_from_json(map))))
    }
}

pub fn struct_from_json(map: Map<String, Json>) -> Struct {
    Struct {
        fields: map
            .into_iter()
            .map(|(k, v)| (k, value_from_json(v)))
            .collect(),
    }
}

pub fn value_from_json(value: Json) -> Value {
    let kind = match value {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(b),
        // Every JSON number is a double in a `Struct`, as in envoyproxy/ratelimit's.
        Json::Number(n) => n.as_f64().map_or(Kind::NullValue(0), Kind::NumberValue),
        Json::String(s) => Kind::StringValue(s),
        Json::Array(items) => Kind::ListValue(ListValue {
            values: items.into_iter().map(value_from_json).collect(),
        }),
        Json::Object(map) => Kind::StructValue(struct_from_json(map)),
    };
    Value { kind: Some(kind) }
}

pub fn struct_to_json(s: &Struct) -> Map<String, Json> {
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), value_to_json(v)))
        .collect()
}

/// A `Value` in the protobuf JSON mapping; a whole number prints without a fraction (`5`, not
/// `5.0`), as Go's and Envoy's printers do.
pub fn value_to_json(value: &Value) -> Json {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::BoolValue(b)) => Json::Bool(*b),
        Some(Kind::NumberValue(n)) => number_to_json(*n),
        Some(Kind::StringValue(s)) => Json::String(s.clone()),
        Some(Kind::ListValue(list)) => Json::Array(list.values.iter().map(value_to_json).collect()),
        Some(Kind::StructValue(s)) => Json::Object(struct_to_json(s)),
    }
}

fn number_to_json(n: f64) -> Json {
    /// Integers up to 2^53 are exact in a double.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if n.fract() == 0.0 && n.abs() <= EXACT {
        // In range and whole, so the cast is exact.
        #[allow(clippy::cast_possible_truncation)]
        return Json::from(n as i64);
    }
    serde_json::Number::from_f64(n).map_or(Json::Null, Json::Number)
}

/// Merges `src` into `dest` as envoyproxy/ratelimit merges the metadata of a response's
/// descriptors: a key already in `dest` keeps its value (the first descriptor wins), except that
/// two structs under one key are merged the same way, recursively; other keys are added.
pub fn merge(dest: &mut Struct, src: &Struct) {
    for (key, value) in &src.fields {
        match dest.fields.get_mut(key) {
            Some(Value {
                kind: Some(Kind::StructValue(inner)),
            }) => {
                if let Some(Kind::StructValue(src_inner)) = &value.kind {
                    merge(inner, src_inner);
                }
            }
            Some(_) => {}
            None => {
                dest.fields.insert(key.clone(), value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Json) -> Map<String, Json> {
        match value {
            Json::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn json_round_trips_through_a_struct() {
        let original = json!({
            "name": "service_1",
            "weight": 5,
            "ratio": 0.25,
            "on": true,
            "none": null,
            "tags": ["a", 1, {"deep": [false]}],
            "nested": {"x": {"y": "z"}}
        });
        let s = struct_from_json(object(original.clone()));
        assert_eq!(
            s.fields["weight"].kind,
            Some(Kind::NumberValue(5.0)),
            "numbers are doubles"
        );
        assert_eq!(Json::Object(struct_to_json(&s)), original);
    }

    #[test]
    fn numbers_print_as_the_json_mapping_does() {
        assert_eq!(number_to_json(5.0), json!(5));
        assert_eq!(number_to_json(-3.0), json!(-3));
        assert_eq!(number_to_json(0.5), json!(0.5));
        assert_eq!(number_to_json(1e300), json!(1e300));
        assert_eq!(number_to_json(f64::NAN), Json::Null);
        assert_eq!(number_to_json(f64::INFINITY), Json::Null);
    }

    #[test]
    fn an_empty_mapping_is_no_metadata_and_xds_numbers_are_finite() {
        assert_eq!(Metadata::from_json(Map::new()), None);
        let xds = Struct {
            fields: [(
                "n".to_owned(),
                Value {
                    kind: Some(Kind::NumberValue(f64::NAN)),
                },
            )]
            .into(),
        };
        let m = Metadata::from_json(struct_to_json(&xds)).expect("one field");
        assert_eq!(m.0.fields["n"].kind, Some(Kind::NullValue(0)));
        assert_eq!(m.clone(), m, "equality is reflexive");
    }

    /// envoyproxy/ratelimit's merge: the first value of a key wins, structs merge recursively.
    #[test]
    fn the_first_descriptor_wins_and_structs_merge() {
        let mut dest = struct_from_json(object(json!({
            "name": "service_1",
            "nested": {"a": 1, "b": {"c": 1}},
            "list": [1]
        })));
        let src = struct_from_json(object(json!({
            "name": "service_2",
            "other": "x",
            "nested": {"a": 2, "b": {"d": 2}, "e": 3},
            "list": [2]
        })));
        merge(&mut dest, &src);
        assert_eq!(
            Json::Object(struct_to_json(&dest)),
            json!({
                "name": "service_1",
                "other": "x",
                "nested": {"a": 1, "b": {"c": 1, "d": 2}, "e": 3},
                "list": [1]
            })
        );
    }
}
