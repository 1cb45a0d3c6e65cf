//! A typed view of the serialized program's JSON: every accessor says which field it wanted and
//! what it found, so a malformed file is an [`ImportError::Malformed`] naming the place.

use super::error::ImportError;
use serde_json::Value;

/// A JSON value and the path that reached it (for error messages).
#[derive(Clone)]
pub struct Json<'a> {
    pub value: &'a Value,
    pub path: String,
}

impl<'a> Json<'a> {
    pub fn new(value: &'a Value, path: &str) -> Json<'a> {
        Json {
            value,
            path: path.to_string(),
        }
    }

    pub fn malformed(&self, reason: impl Into<String>) -> ImportError {
        ImportError::Malformed {
            entry: self.path.clone(),
            reason: reason.into(),
        }
    }

    /// The field `key` of an object, `None` when absent or null.
    pub fn opt(&self, key: &str) -> Option<Json<'a>> {
        match self.value.get(key) {
            None | Some(Value::Null) => None,
            Some(v) => Some(Json {
                value: v,
                path: format!("{}.{key}", self.path),
            }),
        }
    }

    /// The field `key` of an object.
    pub fn get(&self, key: &str) -> Result<Json<'a>, ImportError> {
        self.opt(key)
            .ok_or_else(|| self.malformed(format!("missing field `{key}`")))
    }

    pub fn int(&self) -> Result<i64, ImportError> {
        self.value
            .as_i64()
            .or_else(|| self.value.as_bool().map(i64::from))
            .ok_or_else(|| self.malformed(format!("expected an integer, found {}", self.value)))
    }

    /// A float; PyTorch writes infinities and NaN as the strings `Infinity`, `-Infinity`, `NaN`.
    pub fn float(&self) -> Result<f64, ImportError> {
        match self.value {
            Value::Number(n) => n.as_f64(),
            Value::Bool(b) => Some(f64::from(u8::from(*b))),
            Value::String(s) => match s.as_str() {
                "Infinity" | "inf" => Some(f64::INFINITY),
                "-Infinity" | "-inf" => Some(f64::NEG_INFINITY),
                "NaN" | "nan" => Some(f64::NAN),
                other => other.parse().ok(),
            },
            _ => None,
        }
        .ok_or_else(|| self.malformed(format!("expected a number, found {}", self.value)))
    }

    pub fn bool(&self) -> Result<bool, ImportError> {
        self.value
            .as_bool()
            .ok_or_else(|| self.malformed(format!("expected a bool, found {}", self.value)))
    }

    pub fn str(&self) -> Result<&'a str, ImportError> {
        self.value
            .as_str()
            .ok_or_else(|| self.malformed(format!("expected a string, found {}", self.value)))
    }

    pub fn array(&self) -> Result<Vec<Json<'a>>, ImportError> {
        let items = self.value.as_array().ok_or_else(|| {
            self.malformed(format!("expected a list, found {}", short(self.value)))
        })?;
        Ok(items
            .iter()
            .enumerate()
            .map(|(i, v)| Json {
                value: v,
                path: format!("{}[{i}]", self.path),
            })
            .collect())
    }

    pub fn object(&self) -> Result<Vec<(&'a str, Json<'a>)>, ImportError> {
        let map = self.value.as_object().ok_or_else(|| {
            self.malformed(format!("expected an object, found {}", short(self.value)))
        })?;
        Ok(map
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str(),
                    Json {
                        value: v,
                        path: format!("{}.{k}", self.path),
                    },
                )
            })
            .collect())
    }

    /// A single-key union such as `{"as_tensor": {"name": "x"}}`: its key and value.
    pub fn union(&self) -> Result<(&'a str, Json<'a>), ImportError> {
        let map = self.value.as_object().ok_or_else(|| {
            self.malformed(format!(
                "expected a union object, found {}",
                short(self.value)
            ))
        })?;
        let mut it = map.iter();
        match (it.next(), it.next()) {
            (Some((k, v)), None) => Ok((
                k.as_str(),
                Json {
                    value: v,
                    path: format!("{}.{k}", self.path),
                },
            )),
            _ => Err(self.malformed(format!(
                "expected a union with one key, found {}",
                short(self.value)
            ))),
        }
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 120 {
        format!(
            "{}...",
            &s[..s.char_indices().nth(117).map_or(s.len(), |(i, _)| i)]
        )
    } else {
        s
    }
}

/// `value.key` if present.
pub fn field<'a>(value: &Json<'a>, key: &str) -> Option<Json<'a>> {
    value.opt(key)
}

/// A list of `{"as_int": n}` sizes (a weight's sizes or strides; weights have no symbols).
pub fn ints_of(list: &Json, name: &str) -> Result<Vec<i64>, ImportError> {
    list.array()?
        .iter()
        .map(|item| {
            let (kind, v) = item.union()?;
            match kind {
                "as_int" => v.int(),
                _ => Err(item.malformed(format!(
                    "a size of `{name}` is `{kind}`; stored tensors have static sizes"
                ))),
            }
        })
        .collect()
}
