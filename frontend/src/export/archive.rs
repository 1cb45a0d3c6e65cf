//! Reading a `.pt2` archive: the zip, `models/<name>.json` (the serialized ExportedProgram),
//! and the raw tensor files under `data/weights/` and `data/constants/` with their configs.
//!
//! PyTorch's writer (`torch.export.save`, PyTorch >= 2.8) puts every entry under one top folder
//! named after the file and stores entries uncompressed. This reader finds the folder from the
//! `models/*.json` entry, so a renamed file still loads. Entries that are compressed are refused
//! with a typed error (the `zip` crate is built without decompressors; PyTorch never writes any).

use super::error::ImportError;
use super::json::{field, ints_of, Json};
use minductor_ir::DType;
use minductor_runtime::Tensor;
use serde_json::Value;
use std::collections::HashMap;
use std::io::{Cursor, Read};

/// The schema major version this reader understands (`torch/_export/serde/schema.py`: the
/// major number changes with every breaking change; minors add fields only).
pub const SUPPORTED_SCHEMA_MAJOR: i64 = 8;

/// The parts of an archive the importer uses.
pub struct Archive {
    /// `models/<name>.json`, parsed.
    pub model: Value,
    /// Parameters and buffers by their fully qualified name (`net.0.weight`).
    pub weights: HashMap<String, Tensor>,
    /// Tensor constants (and non-persistent buffers) by name.
    pub constants: HashMap<String, Tensor>,
}

/// Maps a `ScalarType` code of the schema to a minductor dtype.
pub fn dtype_of_code(code: i64, what: &str) -> Result<DType, ImportError> {
    Ok(match code {
        5 => DType::I64,
        6 => DType::F16,
        7 => DType::F32,
        8 => DType::F64,
        12 => DType::Bool,
        13 => DType::BF16,
        _ => {
            return Err(ImportError::UnsupportedDtype {
                what: what.to_string(),
                code,
            })
        }
    })
}

struct Zip {
    archive: zip::ZipArchive<Cursor<Vec<u8>>>,
}

impl Zip {
    fn read(&mut self, entry: &str) -> Result<Option<Vec<u8>>, ImportError> {
        let mut file = match self.archive.by_name(entry) {
            Ok(f) => f,
            Err(zip::result::ZipError::FileNotFound) => return Ok(None),
            Err(e) => {
                return Err(ImportError::Entry {
                    entry: entry.to_string(),
                    reason: e.to_string(),
                })
            }
        };
        let mut bytes = Vec::with_capacity(file.size().min(1 << 32) as usize);
        file.read_to_end(&mut bytes)
            .map_err(|e| ImportError::Entry {
                entry: entry.to_string(),
                reason: e.to_string(),
            })?;
        Ok(Some(bytes))
    }

    fn json(&mut self, entry: &str) -> Result<Option<Value>, ImportError> {
        let Some(bytes) = self.read(entry)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ImportError::Malformed {
                entry: entry.to_string(),
                reason: e.to_string(),
            })
    }
}

/// Opens the archive at `path` (its bytes).
pub fn read_bytes(path: &str, bytes: Vec<u8>) -> Result<Archive, ImportError> {
    let archive = zip::ZipArchive::new(Cursor::new(bytes)).map_err(|e| ImportError::NotZip {
        path: path.to_string(),
        reason: e.to_string(),
    })?;
    let mut zip = Zip { archive };
    let names: Vec<String> = zip
        .archive
        .file_names()
        .map(|n| {
            n.map(|n| n.to_string()).map_err(|e| ImportError::NotZip {
                path: path.to_string(),
                reason: e.to_string(),
            })
        })
        .collect::<Result<_, _>>()?;
    // `<prefix>models/model.json`, else the first `<prefix>models/<name>.json`.
    let model_entry = names
        .iter()
        .find(|n| n.ends_with("models/model.json"))
        .or_else(|| {
            names
                .iter()
                .find(|n| n.contains("models/") && n.ends_with(".json"))
        })
        .cloned()
        .ok_or_else(|| ImportError::MissingEntry {
            entry: "models/model.json".into(),
            hint: if names
                .iter()
                .any(|n| n.ends_with("serialized_exported_program.json"))
            {
                "this is the archive format of PyTorch before 2.8, which is not supported".into()
            } else {
                "not an archive written by torch.export.save".into()
            },
        })?;
    let at = model_entry.rfind("models/").unwrap_or(0);
    let prefix = model_entry[..at].to_string();
    let model = zip
        .json(&model_entry)?
        .ok_or_else(|| ImportError::MissingEntry {
            entry: model_entry.clone(),
            hint: "listed but unreadable".into(),
        })?;
    check_schema(&model, &model_entry)?;
    let weights = read_payload(&mut zip, &prefix, "weights", "model_weights_config.json")?;
    let constants = read_payload(
        &mut zip,
        &prefix,
        "constants",
        "model_constants_config.json",
    )?;
    Ok(Archive {
        model,
        weights,
        constants,
    })
}

fn check_schema(model: &Value, entry: &str) -> Result<(), ImportError> {
    let json = Json::new(model, entry);
    let version = json.get("schema_version")?;
    let major = version.get("major")?.int()?;
    let minor = version
        .opt("minor")
        .map(|m| m.int())
        .transpose()?
        .unwrap_or(0);
    if major != SUPPORTED_SCHEMA_MAJOR {
        return Err(ImportError::SchemaVersion {
            major,
            minor,
            supported: SUPPORTED_SCHEMA_MAJOR,
        });
    }
    Ok(())
}

/// Reads every tensor of `data/<folder>/<config>` (none if the config is absent).
fn read_payload(
    zip: &mut Zip,
    prefix: &str,
    folder: &str,
    config_name: &str,
) -> Result<HashMap<String, Tensor>, ImportError> {
    let config_entry = format!("{prefix}data/{folder}/{config_name}");
    let Some(config) = zip.json(&config_entry)? else {
        return Ok(HashMap::new());
    };
    let json = Json::new(&config, &config_entry);
    let mut out = HashMap::new();
    let mut files: HashMap<String, Vec<u8>> = HashMap::new();
    let Some(entries) = json.opt("config") else {
        return Ok(out);
    };
    for (name, meta) in entries.object()? {
        let path_name = meta.get("path_name")?.str()?.to_string();
        if meta.opt("use_pickle").and_then(|p| p.bool().ok()) == Some(true) {
            return Err(ImportError::Unsupported(format!(
                "`{name}` is stored pickled (a custom object or tensor subclass)"
            )));
        }
        let tensor_meta = meta.get("tensor_meta")?;
        let entry = format!("{prefix}data/{folder}/{path_name}");
        if !files.contains_key(&path_name) {
            let bytes = zip.read(&entry)?.ok_or_else(|| ImportError::MissingEntry {
                entry: entry.clone(),
                hint: format!("the file of `{name}`"),
            })?;
            files.insert(path_name.clone(), bytes);
        }
        let tensor = tensor_from_storage(name, &path_name, &tensor_meta, &files[&path_name])?;
        out.insert(name.to_string(), tensor);
    }
    Ok(out)
}

/// The tensor `meta` describes inside the raw little-endian storage `bytes` (sizes, strides and
/// storage offset in elements), copied out contiguously.
fn tensor_from_storage(
    name: &str,
    file: &str,
    meta: &Json,
    bytes: &[u8],
) -> Result<Tensor, ImportError> {
    let dtype = dtype_of_code(meta.get("dtype")?.int()?, name)?;
    let sizes = ints_of(&meta.get("sizes")?, name)?;
    let strides = match meta.opt("strides") {
        Some(s) => ints_of(&s, name)?,
        None => Vec::new(),
    };
    let offset = match meta.opt("storage_offset") {
        Some(o) => field(&o, "as_int")
            .map(|v| v.int())
            .transpose()?
            .unwrap_or(0),
        None => 0,
    };
    let malformed = |reason: String| ImportError::Malformed {
        entry: format!("tensor_meta of `{name}`"),
        reason,
    };
    if sizes.iter().chain(&strides).any(|&v| v < 0) || offset < 0 {
        return Err(malformed(format!(
            "negative size, stride or offset: sizes {sizes:?}, strides {strides:?}, offset {offset}"
        )));
    }
    let shape: Vec<usize> = sizes.iter().map(|&s| s as usize).collect();
    let strides: Vec<usize> = if strides.len() == shape.len() {
        strides.iter().map(|&s| s as usize).collect()
    } else if strides.is_empty() {
        minductor_runtime::contiguous_strides(&shape)
    } else {
        return Err(malformed(format!(
            "{} strides for {} sizes",
            strides.len(),
            shape.len()
        )));
    };
    let element = dtype.size_bytes();
    let numel = shape
        .iter()
        .try_fold(1usize, |a, &n| a.checked_mul(n))
        .ok_or_else(|| malformed(format!("sizes {shape:?} overflow")))?;
    // The last element read, in elements from the storage's start.
    let span = if numel == 0 {
        0
    } else {
        shape
            .iter()
            .zip(&strides)
            .try_fold(offset as usize, |a, (&n, &s)| {
                (n - 1).checked_mul(s).and_then(|x| a.checked_add(x))
            })
            .and_then(|last| last.checked_add(1))
            .ok_or_else(|| malformed("strides overflow".into()))?
    };
    let expected = span
        .checked_mul(element)
        .ok_or_else(|| malformed("size overflows".into()))?;
    if bytes.len() < expected || !bytes.len().is_multiple_of(element) {
        return Err(ImportError::WeightSize {
            name: name.to_string(),
            file: file.to_string(),
            expected,
            found: bytes.len(),
        });
    }
    let contiguous = strides == minductor_runtime::contiguous_strides(&shape);
    let data = if contiguous {
        let start = offset as usize * element;
        bytes[start..start + numel * element].to_vec()
    } else {
        let mut data = Vec::with_capacity(numel * element);
        let mut index = vec![0usize; shape.len()];
        for _ in 0..numel {
            let at = offset as usize
                + index
                    .iter()
                    .zip(&strides)
                    .map(|(i, s)| i * s)
                    .sum::<usize>();
            data.extend_from_slice(&bytes[at * element..(at + 1) * element]);
            for d in (0..shape.len()).rev() {
                index[d] += 1;
                if index[d] < shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        data
    };
    Tensor::from_bytes(dtype, &shape, &data).map_err(|e| malformed(e.to_string()))
}
