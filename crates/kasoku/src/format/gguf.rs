//! GGUF reader (v2 and v3, little-endian), memory-mapped: metadata of every value type,
//! tensor infos, alignment, and validation of every count, string, shape and offset against
//! the file size; plus a small v3 writer ([`write_gguf`]) for tests and fixtures.
//!
//! Layout of a GGUF file: magic `GGUF`, version (u32), tensor count (u64), metadata count (u64),
//! the metadata key/values, the tensor infos (name, n_dims, `ne` innermost first, ggml type id,
//! offset relative to the data section), padding to `general.alignment` (default 32), then the
//! data section. The reader treats the file as hostile: no count is trusted before it is capped
//! by the bytes that remain, and no arithmetic is unchecked.
//!
//! Caveat: the file is memory-mapped; if another process truncates it while it is open, reading
//! a tensor can fault (the OS raises SIGBUS). Nothing can validate that away.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use super::{FormatError, RawTensor, TensorBytes, TensorSource};
use crate::quant::DType;

const MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of the data section and of tensor offsets when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// GGML's limit on tensor dimensions.
const MAX_DIMS: u32 = 4;
/// Arrays nested deeper than this are rejected (no real file nests at all; a hostile one could
/// otherwise exhaust the stack).
const MAX_ARRAY_DEPTH: u32 = 8;

/// A metadata value. Integer accessors are lenient about widths and signedness: a `U32` of 7
/// and an `I64` of 7 both answer `as_u64() == Some(7)`.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The value as an unsigned integer, if it is an integer that fits.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float: floats, and integers (converted).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self
                .as_i64()
                .map(|v| v as f64)
                .or_else(|| self.as_u64().map(|v| v as f64)),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// GGUF's name of the value's type (`u32`, `string`, `array`...).
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F32(_) => "f32",
            MetaValue::F64(_) => "f64",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
        }
    }

    /// GGUF's numeric type id of the value.
    fn type_id(&self) -> u32 {
        match self {
            MetaValue::U8(_) => 0,
            MetaValue::I8(_) => 1,
            MetaValue::U16(_) => 2,
            MetaValue::I16(_) => 3,
            MetaValue::U32(_) => 4,
            MetaValue::I32(_) => 5,
            MetaValue::F32(_) => 6,
            MetaValue::Bool(_) => 7,
            MetaValue::String(_) => 8,
            MetaValue::Array(_) => 9,
            MetaValue::U64(_) => 10,
            MetaValue::I64(_) => 11,
            MetaValue::F64(_) => 12,
        }
    }
}

/// Where one tensor lives in a GGUF file.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    pub dtype: DType,
    /// Outermost dimension first (GGUF's `ne`, reversed).
    pub shape: Vec<usize>,
    /// Offset from the start of the data section, as stored in the file.
    pub offset: u64,
    /// Absolute byte offset of the data in the file.
    pub file_offset: usize,
    /// Size of the data in bytes.
    pub nbytes: usize,
}

/// An open, validated GGUF file.
pub struct GgufFile {
    path: PathBuf,
    version: u32,
    alignment: u64,
    data_offset: usize,
    metadata: BTreeMap<String, MetaValue>,
    tensors: Vec<GgufTensorInfo>,
    by_name: HashMap<String, usize>,
    mmap: Arc<Mmap>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens, maps and validates a GGUF file.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, FormatError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| FormatError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < 24 {
            return Err(FormatError::Corrupt {
                path,
                reason: format!("{len} bytes is too short for a GGUF header"),
            });
        }
        // SAFETY: the map is read-only; the file is not modified by this process. Another
        // process truncating it while mapped is outside what any reader can guard against.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path, Arc::new(mmap))
    }

    fn parse(path: PathBuf, mmap: Arc<Mmap>) -> Result<GgufFile, FormatError> {
        let bytes: &[u8] = &mmap;
        let corrupt = |reason: String| FormatError::Corrupt {
            path: path.clone(),
            reason,
        };
        let mut r = Reader { bytes, pos: 0 };

        let magic = r.take(4, "magic").map_err(corrupt)?;
        if magic != MAGIC {
            return Err(corrupt(format!(
                "bad magic {magic:02x?} (expected \"GGUF\")"
            )));
        }
        let version = r.u32("version").map_err(corrupt)?;
        if version != 2 && version != 3 {
            return Err(corrupt(format!(
                "unsupported GGUF version {version} (kasoku reads 2 and 3)"
            )));
        }
        let n_tensors = r.u64("tensor count").map_err(corrupt)?;
        let n_kv = r.u64("metadata count").map_err(corrupt)?;
        // Every key/value takes at least 13 bytes (key length, empty key, type, one-byte value);
        // every tensor info at least 24 (name length, n_dims, type, offset).
        if n_kv > (r.remaining() / 13) as u64 {
            return Err(corrupt(format!(
                "metadata count {n_kv} cannot fit in the file"
            )));
        }
        if n_tensors > (r.remaining() / 24) as u64 {
            return Err(corrupt(format!(
                "tensor count {n_tensors} cannot fit in the file"
            )));
        }

        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = r
                .string(&format!("key of metadata entry {i}"))
                .map_err(corrupt)?;
            let ty = r
                .u32(&format!("type of metadata '{key}'"))
                .map_err(corrupt)?;
            let value = r.value(ty, 0, &key).map_err(corrupt)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(corrupt(format!("duplicate metadata key '{key}'")));
            }
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= 1 << 20 => a,
                _ => {
                    return Err(corrupt(format!(
                        "general.alignment {v:?} is not a power of two"
                    )))
                }
            },
        };

        struct Pending {
            name: String,
            type_id: u32,
            ne: Vec<u64>,
            offset: u64,
        }
        let mut pending = Vec::with_capacity(n_tensors as usize);
        for i in 0..n_tensors {
            let name = r.string(&format!("name of tensor {i}")).map_err(corrupt)?;
            let n_dims = r
                .u32(&format!("n_dims of tensor '{name}'"))
                .map_err(corrupt)?;
            if n_dims > MAX_DIMS {
                return Err(corrupt(format!(
                    "tensor '{name}' has {n_dims} dimensions (at most {MAX_DIMS})"
                )));
            }
            let mut ne = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                ne.push(
                    r.u64(&format!("shape of tensor '{name}'"))
                        .map_err(corrupt)?,
                );
            }
            let type_id = r
                .u32(&format!("type of tensor '{name}'"))
                .map_err(corrupt)?;
            let offset = r
                .u64(&format!("offset of tensor '{name}'"))
                .map_err(corrupt)?;
            pending.push(Pending {
                name,
                type_id,
                ne,
                offset,
            });
        }

        let header_end = r.pos as u64;
        let data_offset = header_end.div_ceil(alignment) * alignment;
        let file_len = bytes.len() as u64;
        let data_len = file_len.saturating_sub(data_offset);

        let mut tensors = Vec::with_capacity(pending.len());
        let mut by_name = HashMap::with_capacity(pending.len());
        for p in pending {
            let Some(dtype) = DType::from_ggml_id(p.type_id) else {
                return Err(FormatError::UnsupportedType {
                    path: path.clone(),
                    tensor: p.name,
                    type_name: ggml_type_name(p.type_id),
                });
            };
            let mut numel: u64 = 1;
            for &d in &p.ne {
                numel = numel
                    .checked_mul(d)
                    .filter(|&n| n <= i64::MAX as u64)
                    .ok_or_else(|| {
                        corrupt(format!("tensor '{}' shape {:?} overflows", p.name, p.ne))
                    })?;
            }
            let inner = p.ne.first().copied().unwrap_or(1);
            if inner % dtype.block_size() as u64 != 0 {
                return Err(corrupt(format!(
                    "tensor '{}' ({dtype}) has rows of {inner} values, not a multiple of the block size {}",
                    p.name,
                    dtype.block_size()
                )));
            }
            let nbytes = usize::try_from(numel)
                .ok()
                .and_then(|n| dtype.bytes_for(n))
                .ok_or_else(|| {
                    corrupt(format!("tensor '{}' shape {:?} overflows", p.name, p.ne))
                })?;
            if p.offset % alignment != 0 {
                return Err(corrupt(format!(
                    "tensor '{}' offset {} is not a multiple of the alignment {alignment}",
                    p.name, p.offset
                )));
            }
            match p.offset.checked_add(nbytes as u64) {
                Some(end) if end <= data_len => {}
                _ => {
                    return Err(FormatError::Truncated {
                        path: path.clone(),
                        tensor: p.name,
                    })
                }
            }
            let file_offset = (data_offset + p.offset) as usize; // <= file_len, checked above
            let shape: Vec<usize> = p.ne.iter().rev().map(|&d| d as usize).collect();
            if by_name.insert(p.name.clone(), tensors.len()).is_some() {
                return Err(corrupt(format!("duplicate tensor name '{}'", p.name)));
            }
            tensors.push(GgufTensorInfo {
                name: p.name,
                dtype,
                shape,
                offset: p.offset,
                file_offset,
                nbytes,
            });
        }

        // No two tensors may share bytes.
        let mut order: Vec<&GgufTensorInfo> = tensors.iter().filter(|t| t.nbytes > 0).collect();
        order.sort_by_key(|t| t.offset);
        for pair in order.windows(2) {
            if pair[0].offset + pair[0].nbytes as u64 > pair[1].offset {
                return Err(corrupt(format!(
                    "tensors '{}' and '{}' overlap",
                    pair[0].name, pair[1].name
                )));
            }
        }

        Ok(GgufFile {
            path,
            version,
            alignment,
            data_offset: data_offset.min(file_len) as usize,
            metadata,
            tensors,
            by_name,
            mmap,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of the data section and tensor offsets.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    pub fn metadata(&self) -> &BTreeMap<String, MetaValue> {
        &self.metadata
    }

    /// A metadata value. (Not a tensor: for tensors use [`GgufFile::tensor`] or
    /// [`TensorSource::get`].)
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    /// A tensor by name (same as [`TensorSource::get`]).
    pub fn tensor(&self, name: &str) -> Option<RawTensor> {
        TensorSource::get(self, name)
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    pub fn get_array(&self, key: &str) -> Option<&[MetaValue]> {
        self.get(key)?.as_array()
    }

    /// `general.architecture` (`llama`, `qwen2`, `qwen35`...).
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// The value of `{architecture}.{suffix}` (e.g. `arch_key("block_count")`).
    pub fn arch_get(&self, suffix: &str) -> Option<&MetaValue> {
        self.get(&format!("{}.{suffix}", self.architecture()?))
    }

    /// A required metadata value, or an error naming the file and the key.
    pub fn require(&self, key: &str) -> Result<&MetaValue, FormatError> {
        self.get(key)
            .ok_or_else(|| self.meta_err(format!("missing key '{key}'")))
    }

    /// A required integer, or an error naming the file and the key.
    pub fn require_u64(&self, key: &str) -> Result<u64, FormatError> {
        let v = self.require(key)?;
        v.as_u64().ok_or_else(|| {
            self.meta_err(format!("'{key}' is {v:?}, expected a non-negative integer"))
        })
    }

    /// A required number, or an error naming the file and the key.
    pub fn require_f64(&self, key: &str) -> Result<f64, FormatError> {
        let v = self.require(key)?;
        v.as_f64()
            .ok_or_else(|| self.meta_err(format!("'{key}' is {v:?}, expected a number")))
    }

    /// A required string, or an error naming the file and the key.
    pub fn require_str(&self, key: &str) -> Result<&str, FormatError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| {
            self.meta_err(format!("'{key}' is a {}, expected a string", v.type_name()))
        })
    }

    fn meta_err(&self, reason: String) -> FormatError {
        FormatError::Metadata {
            path: self.path.clone(),
            reason,
        }
    }

    /// Tensor infos in file order.
    pub fn tensor_infos(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The whole mapped file (shared owner of every tensor's bytes).
    pub fn mmap(&self) -> &Arc<Mmap> {
        &self.mmap
    }
}

impl TensorSource for GgufFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn names(&self) -> Vec<String> {
        self.tensors.iter().map(|t| t.name.clone()).collect()
    }

    fn get(&self, name: &str) -> Option<RawTensor> {
        let info = self.tensor_info(name)?;
        Some(RawTensor {
            name: info.name.clone(),
            dtype: info.dtype,
            shape: info.shape.clone(),
            data: TensorBytes::mapped(self.mmap.clone(), info.file_offset, info.nbytes),
        })
    }
}

/// GGML's name for a type id (for error messages about types kasoku does not load).
fn ggml_type_name(id: u32) -> String {
    const NAMES: [&str; 40] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2",
        "Q4_3",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
    ];
    match NAMES.get(id as usize) {
        Some(name) => format!("{name} (ggml type {id})"),
        None => format!("unknown ggml type {id}"),
    }
}

/// A bounds-checked little-endian cursor. Errors are human-readable reasons.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err(format!(
                "unexpected end of file at byte {} reading {what} ({n} bytes needed, {} left)",
                self.pos,
                self.remaining()
            ));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length-prefixed string; the length is checked against the remaining bytes before
    /// anything is allocated. Invalid UTF-8 is an error (keys and tensor names).
    fn string(&mut self, what: &str) -> Result<String, String> {
        let len = self.u64(what)?;
        if len > self.remaining() as u64 {
            return Err(format!(
                "{what}: string length {len} at byte {} exceeds the {} bytes left",
                self.pos - 8,
                self.remaining()
            ));
        }
        let raw = self.take(len as usize, what)?;
        String::from_utf8(raw.to_vec())
            .map_err(|_| format!("{what}: invalid UTF-8 at byte {}", self.pos - raw.len()))
    }

    /// A string value: invalid UTF-8 sequences become U+FFFD rather than failing the file
    /// (a vocabulary with one odd token should still load).
    fn lossy_string(&mut self, what: &str) -> Result<String, String> {
        let len = self.u64(what)?;
        if len > self.remaining() as u64 {
            return Err(format!(
                "{what}: string length {len} at byte {} exceeds the {} bytes left",
                self.pos - 8,
                self.remaining()
            ));
        }
        let raw = self.take(len as usize, what)?;
        Ok(String::from_utf8_lossy(raw).into_owned())
    }

    fn value(&mut self, ty: u32, depth: u32, key: &str) -> Result<MetaValue, String> {
        let what = || format!("value of metadata '{key}'");
        Ok(match ty {
            0 => MetaValue::U8(self.array::<1>(&what())?[0]),
            1 => MetaValue::I8(self.array::<1>(&what())?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(&what())?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(&what())?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.array(&what())?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(&what())?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(&what())?)),
            7 => match self.array::<1>(&what())?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(format!("metadata '{key}': invalid bool byte {b}")),
            },
            8 => MetaValue::String(self.lossy_string(&what())?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!(
                        "metadata '{key}': arrays nested deeper than {MAX_ARRAY_DEPTH}"
                    ));
                }
                let elem_ty = self.u32(&what())?;
                let count = self.u64(&what())?;
                let min_size: u64 = match elem_ty {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    t => return Err(format!("metadata '{key}': unknown array element type {t}")),
                };
                if count > self.remaining() as u64 / min_size {
                    return Err(format!(
                        "metadata '{key}': array of {count} elements cannot fit in the {} bytes left",
                        self.remaining()
                    ));
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem_ty, depth + 1, key)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(u64::from_le_bytes(self.array(&what())?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(&what())?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(&what())?)),
            t => return Err(format!("metadata '{key}': unknown value type {t}")),
        })
    }
}

/// Writes a GGUF v3 file. `tensors` are `(name, dtype, shape outermost-first, bytes)`; each
/// tensor's bytes must be exactly the size its dtype and shape imply. Tensors are stored in the
/// given order, each aligned to `general.alignment` (if in `metadata`) or 32. Arrays must hold
/// elements of one type (an empty array is written as an array of u8).
pub fn write_gguf<K, N, S, B>(
    path: impl AsRef<Path>,
    metadata: &[(K, MetaValue)],
    tensors: &[(N, DType, S, B)],
) -> Result<(), FormatError>
where
    K: AsRef<str>,
    N: AsRef<str>,
    S: AsRef<[usize]>,
    B: AsRef<[u8]>,
{
    let path = path.as_ref();
    let bad = |reason: String| FormatError::Metadata {
        path: path.to_path_buf(),
        reason,
    };
    let alignment = match metadata
        .iter()
        .find(|(k, _)| k.as_ref() == "general.alignment")
    {
        None => DEFAULT_ALIGNMENT,
        Some((_, v)) => v
            .as_u64()
            .filter(|a| a.is_power_of_two())
            .ok_or_else(|| bad(format!("general.alignment {v:?} is not a power of two")))?,
    } as usize;

    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_string(&mut out, key.as_ref());
        out.extend_from_slice(&value.type_id().to_le_bytes());
        put_value(&mut out, value).map_err(|e| bad(format!("'{}': {e}", key.as_ref())))?;
    }

    let mut offset = 0usize;
    let mut offsets = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, data) in tensors {
        let (name, shape, data) = (name.as_ref(), shape.as_ref(), data.as_ref());
        let numel: usize = shape.iter().product();
        if dtype.bytes_for(numel) != Some(data.len())
            || shape.last().is_some_and(|&d| d % dtype.block_size() != 0)
        {
            return Err(bad(format!(
                "tensor '{name}': {} bytes do not hold a {dtype} tensor of shape {shape:?}",
                data.len()
            )));
        }
        if shape.len() > MAX_DIMS as usize {
            return Err(bad(format!(
                "tensor '{name}' has more than {MAX_DIMS} dimensions"
            )));
        }
        put_string(&mut out, name);
        out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        for &d in shape.iter().rev() {
            out.extend_from_slice(&(d as u64).to_le_bytes());
        }
        out.extend_from_slice(&dtype.ggml_id().to_le_bytes());
        out.extend_from_slice(&(offset as u64).to_le_bytes());
        offsets.push(offset);
        offset = (offset + data.len()).div_ceil(alignment) * alignment;
    }

    let data_start = out.len().div_ceil(alignment) * alignment;
    out.resize(data_start, 0);
    for ((_, _, _, data), &off) in tensors.iter().zip(&offsets) {
        out.resize(data_start + off, 0);
        out.extend_from_slice(data.as_ref());
    }

    let io = |source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::create(path).map_err(io)?;
    file.write_all(&out).map_err(io)?;
    file.flush().map_err(io)
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &MetaValue) -> Result<(), String> {
    match value {
        MetaValue::U8(v) => out.push(*v),
        MetaValue::I8(v) => out.push(*v as u8),
        MetaValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::Bool(v) => out.push(u8::from(*v)),
        MetaValue::String(s) => put_string(out, s),
        MetaValue::Array(items) => {
            let elem_ty = items.first().map_or(0, MetaValue::type_id);
            if items.iter().any(|v| v.type_id() != elem_ty) {
                return Err("array elements of mixed types".into());
            }
            out.extend_from_slice(&elem_ty.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_util::{cached_model, ScratchDir, SMOLLM2};
    use crate::format::Claims;

    /// Hand-built GGUF header bytes, for files the writer refuses to make.
    struct Raw(Vec<u8>);

    impl Raw {
        fn new(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
            let mut b = b"GGUF".to_vec();
            b.extend_from_slice(&version.to_le_bytes());
            b.extend_from_slice(&n_tensors.to_le_bytes());
            b.extend_from_slice(&n_kv.to_le_bytes());
            Raw(b)
        }
        fn u32(mut self, v: u32) -> Raw {
            self.0.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn u64(mut self, v: u64) -> Raw {
            self.0.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn str(self, s: &str) -> Raw {
            let mut r = self.u64(s.len() as u64);
            r.0.extend_from_slice(s.as_bytes());
            r
        }
        /// A tensor info: name, ne (innermost first), ggml type, offset.
        fn tensor(self, name: &str, ne: &[u64], ty: u32, offset: u64) -> Raw {
            let mut r = self.str(name).u32(ne.len() as u32);
            for &d in ne {
                r = r.u64(d);
            }
            r.u32(ty).u64(offset)
        }
        /// Pads to 32 and appends `n` data bytes.
        fn data(mut self, n: usize) -> Raw {
            let start = self.0.len().div_ceil(32) * 32;
            self.0.resize(start + n, 0);
            self
        }
        fn open(self, dir: &ScratchDir) -> (PathBuf, Result<GgufFile, FormatError>) {
            let path = dir.join("raw.gguf");
            std::fs::write(&path, &self.0).unwrap();
            let r = GgufFile::open(&path);
            (path, r)
        }
    }

    fn sample_metadata() -> Vec<(String, MetaValue)> {
        use MetaValue::*;
        vec![
            ("general.architecture".into(), String("llama".into())),
            ("llama.block_count".into(), U32(30)),
            ("a.u8".into(), U8(200)),
            ("a.i8".into(), I8(-5)),
            ("a.u16".into(), U16(60000)),
            ("a.i16".into(), I16(-30000)),
            ("a.i32".into(), I32(-7)),
            ("a.u64".into(), U64(1 << 40)),
            ("a.i64".into(), I64(-(1 << 40))),
            ("a.f32".into(), F32(1e-5)),
            ("a.f64".into(), F64(0.125)),
            ("a.bool".into(), Bool(true)),
            (
                "a.strings".into(),
                Array(vec![String("héllo".into()), String("".into())]),
            ),
            (
                "a.nested".into(),
                Array(vec![Array(vec![I32(1), I32(2)]), Array(vec![I32(3)])]),
            ),
            ("a.empty".into(), Array(vec![])),
        ]
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Writes a small file with an F32 [2,3] matrix, an F16 vector and a Q8_0 [2,32] matrix.
    fn write_sample(path: &Path) {
        let q8: Vec<u8> = (0..68u8).collect();
        let tensors: Vec<(&str, DType, Vec<usize>, Vec<u8>)> = vec![
            (
                "w",
                DType::F32,
                vec![2, 3],
                f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            ),
            ("v", DType::F16, vec![5], vec![7u8; 10]),
            ("q", DType::Q8_0, vec![2, 32], q8),
        ];
        write_gguf(path, &sample_metadata(), &tensors).unwrap();
    }

    #[test]
    fn round_trip_writer_to_reader() {
        let dir = ScratchDir::new("gguf-rt");
        let path = dir.join("m.gguf");
        write_sample(&path);
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.alignment(), 32);
        assert_eq!(f.architecture(), Some("llama"));
        for (k, v) in sample_metadata() {
            assert_eq!(f.get(&k), Some(&v), "{k}");
        }
        assert_eq!(f.metadata().len(), sample_metadata().len());
        assert_eq!(
            f.arch_get("block_count").and_then(MetaValue::as_u64),
            Some(30)
        );
        assert_eq!(f.get_u64("a.i32"), None);
        assert_eq!(f.get_i64("a.i32"), Some(-7));
        assert_eq!(f.get_u64("a.u8"), Some(200));
        assert_eq!(f.get_f64("a.f32"), Some(1e-5f32 as f64));
        assert_eq!(f.get_str("a.strings"), None);
        assert_eq!(f.get_array("a.strings").unwrap()[0].as_str(), Some("héllo"));
        assert!(f
            .require_u64("missing.key")
            .unwrap_err()
            .to_string()
            .contains("missing.key"));

        assert_eq!(f.names(), vec!["w", "v", "q"]);
        let infos = f.tensor_infos();
        assert_eq!(infos[0].shape, vec![2, 3]);
        assert_eq!(infos[2].dtype, DType::Q8_0);
        assert!(infos
            .iter()
            .all(|t| t.offset % 32 == 0 && t.file_offset % 32 == 0));
        let w = TensorSource::get(&f, "w").unwrap();
        assert_eq!(
            w.data.as_slice(),
            &f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])[..]
        );
        let q = TensorSource::get(&f, "q").unwrap();
        assert_eq!(q.shape, vec![2, 32]);
        assert_eq!(q.data.as_slice(), &(0..68u8).collect::<Vec<_>>()[..]);
        assert_eq!(
            TensorSource::get(&f, "v").unwrap().data.as_slice(),
            &[7u8; 10]
        );
        assert!(TensorSource::get(&f, "nope").is_none());
    }

    #[test]
    fn writer_rejects_wrong_byte_count() {
        let dir = ScratchDir::new("gguf-w");
        let e = write_gguf(
            dir.join("x.gguf"),
            &[] as &[(&str, MetaValue)],
            &[("t", DType::F32, [3], [0u8; 8])],
        )
        .unwrap_err();
        assert!(e.to_string().contains("'t'"), "{e}");
    }

    #[test]
    fn truncated_file_names_file_and_tensor() {
        let dir = ScratchDir::new("gguf-trunc");
        let path = dir.join("m.gguf");
        write_sample(&path);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let e = GgufFile::open(&path).unwrap_err();
        assert!(
            matches!(&e, FormatError::Truncated { tensor, .. } if tensor == "q"),
            "{e}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains(&path.display().to_string()) && msg.contains("'q'"),
            "{msg}"
        );
    }

    #[test]
    fn truncated_header_is_corrupt() {
        let dir = ScratchDir::new("gguf-trunc-h");
        let path = dir.join("m.gguf");
        write_sample(&path);
        let bytes = std::fs::read(&path).unwrap();
        for cut in [30, 100, 200] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let e = GgufFile::open(&path).unwrap_err();
            assert!(matches!(e, FormatError::Corrupt { .. }), "cut {cut}: {e}");
        }
        std::fs::write(&path, &bytes[..10]).unwrap();
        assert!(GgufFile::open(&path)
            .unwrap_err()
            .to_string()
            .contains("too short"));
    }

    #[test]
    fn bad_magic_and_version() {
        let dir = ScratchDir::new("gguf-magic");
        let mut raw = Raw::new(3, 0, 0);
        raw.0[0] = b'X';
        let (path, r) = raw.open(&dir);
        let msg = r.unwrap_err().to_string();
        assert!(
            msg.contains("bad magic") && msg.contains(&path.display().to_string()),
            "{msg}"
        );
        for v in [1, 4, u32::MAX] {
            let msg = Raw::new(v, 0, 0).open(&dir).1.unwrap_err().to_string();
            assert!(msg.contains("unsupported GGUF version"), "{msg}");
        }
        let f = Raw::new(2, 0, 0).open(&dir).1.unwrap();
        assert_eq!((f.version(), f.tensor_infos().len()), (2, 0));
    }

    #[test]
    fn absurd_counts_and_lengths_are_rejected_without_allocating() {
        let dir = ScratchDir::new("gguf-absurd");
        let cases: Vec<(Raw, &str)> = vec![
            (Raw::new(3, u64::MAX, 0).data(64), "tensor count"),
            (Raw::new(3, 0, u64::MAX).data(64), "metadata count"),
            (Raw::new(3, 0, 1).u64(u64::MAX).data(64), "exceeds"),
            (Raw::new(3, 0, 1).str("k").u32(8).u64(1 << 60), "exceeds"),
            (
                Raw::new(3, 0, 1)
                    .str("k")
                    .u32(9)
                    .u32(10)
                    .u64(u64::MAX / 2)
                    .data(64),
                "cannot fit",
            ),
            (
                Raw::new(3, 0, 1).str("k").u32(9).u32(77).u64(1).data(64),
                "unknown array element type",
            ),
            (
                Raw::new(3, 0, 1).str("k").u32(42).data(64),
                "unknown value type",
            ),
            (
                Raw::new(3, 1, 0)
                    .tensor("t", &[1, 1, 1, 1, 1], 0, 0)
                    .data(64),
                "dimensions",
            ),
            (
                Raw::new(3, 1, 0).tensor("t", &[u64::MAX, 4], 0, 0).data(64),
                "overflows",
            ),
        ];
        for (raw, expect) in cases {
            let msg = raw.open(&dir).1.unwrap_err().to_string();
            assert!(msg.contains(expect), "expected '{expect}' in: {msg}");
        }
        // Deeply nested arrays.
        let mut raw = Raw::new(3, 0, 1).str("deep").u32(9);
        for _ in 0..20 {
            raw = raw.u32(9).u64(1);
        }
        let msg = raw
            .u32(0)
            .u64(0)
            .data(64)
            .open(&dir)
            .1
            .unwrap_err()
            .to_string();
        assert!(msg.contains("nested"), "{msg}");
        // Invalid UTF-8: fatal in a key, replaced in a value.
        let mut raw = Raw::new(3, 0, 1).u64(2);
        raw.0.extend_from_slice(&[0xff, 0xfe]);
        let msg = raw
            .u32(0)
            .u32(7)
            .data(8)
            .open(&dir)
            .1
            .unwrap_err()
            .to_string();
        assert!(msg.contains("invalid UTF-8"), "{msg}");
        let mut raw = Raw::new(3, 0, 1).str("k").u32(8).u64(3);
        raw.0.extend_from_slice(&[b'a', 0xff, b'b']);
        let f = raw.data(8).open(&dir).1.unwrap();
        assert_eq!(f.get_str("k"), Some("a\u{fffd}b"));
        // A bool byte other than 0 or 1.
        let mut raw = Raw::new(3, 0, 1).str("b").u32(7);
        raw.0.push(2);
        let msg = raw.data(32).open(&dir).1.unwrap_err().to_string();
        assert!(msg.contains("invalid bool"), "{msg}");
    }

    #[test]
    fn bad_offsets_and_blocks() {
        let dir = ScratchDir::new("gguf-offsets");
        // Unaligned offset.
        let msg = Raw::new(3, 1, 0)
            .tensor("t", &[4], 0, 4)
            .data(64)
            .open(&dir)
            .1
            .unwrap_err()
            .to_string();
        assert!(msg.contains("'t'") && msg.contains("alignment"), "{msg}");
        // Offset past the end of the file.
        let e = Raw::new(3, 1, 0)
            .tensor("t", &[4], 0, 1 << 62)
            .data(64)
            .open(&dir)
            .1
            .unwrap_err();
        assert!(
            matches!(&e, FormatError::Truncated { tensor, .. } if tensor == "t"),
            "{e}"
        );
        // Offset + size overflowing u64.
        let e = Raw::new(3, 1, 0)
            .tensor("t", &[4], 0, u64::MAX - 31)
            .data(64)
            .open(&dir)
            .1
            .unwrap_err();
        assert!(matches!(&e, FormatError::Truncated { .. }), "{e}");
        // Overlap.
        let msg = Raw::new(3, 2, 0)
            .tensor("a", &[16], 0, 0)
            .tensor("b", &[16], 0, 32)
            .data(128)
            .open(&dir)
            .1
            .unwrap_err()
            .to_string();
        assert!(msg.contains("'a' and 'b' overlap"), "{msg}");
        // Rows not a whole number of Q8_0 blocks.
        let msg = Raw::new(3, 1, 0)
            .tensor("q", &[16, 2], 8, 0)
            .data(64)
            .open(&dir)
            .1
            .unwrap_err()
            .to_string();
        assert!(msg.contains("'q'") && msg.contains("block size"), "{msg}");
        // Unsupported (IQ2_XXS) and unknown type ids.
        let e = Raw::new(3, 1, 0)
            .tensor("iq", &[256], 16, 0)
            .data(128)
            .open(&dir)
            .1
            .unwrap_err();
        assert!(
            matches!(&e, FormatError::UnsupportedType { tensor, .. } if tensor == "iq"),
            "{e}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains("IQ2_XXS") && msg.contains("'iq'") && msg.contains("raw.gguf"),
            "{msg}"
        );
        let msg = Raw::new(3, 1, 0)
            .tensor("u", &[4], 999, 0)
            .data(64)
            .open(&dir)
            .1
            .unwrap_err()
            .to_string();
        assert!(msg.contains("'u'") && msg.contains("999"), "{msg}");
        // Duplicates.
        let msg = Raw::new(3, 2, 0)
            .tensor("a", &[8], 0, 0)
            .tensor("a", &[8], 0, 32)
            .data(64)
            .open(&dir)
            .1
            .unwrap_err()
            .to_string();
        assert!(msg.contains("duplicate tensor"), "{msg}");
        // Custom alignment that is not a power of two.
        let msg = Raw::new(3, 0, 1)
            .str("general.alignment")
            .u32(4)
            .u32(24)
            .data(8)
            .open(&dir)
            .1
            .unwrap_err();
        assert!(msg.to_string().contains("power of two"), "{msg}");
    }

    #[test]
    fn custom_alignment_round_trip() {
        let dir = ScratchDir::new("gguf-align");
        let path = dir.join("a.gguf");
        let meta = [("general.alignment", MetaValue::U32(64))];
        write_gguf(
            &path,
            &meta,
            &[
                ("a", DType::F32, &[3usize][..], &[1u8; 12][..]),
                ("b", DType::F32, &[1], &[2u8; 4]),
            ],
        )
        .unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.alignment(), 64);
        assert_eq!(f.tensor_info("b").unwrap().offset, 64);
        assert_eq!(f.data_offset() % 64, 0);
        assert_eq!(
            TensorSource::get(&f, "b").unwrap().data.as_slice(),
            &[2u8; 4]
        );
    }

    #[test]
    fn claims_report_wrong_shape_missing_and_unclaimed() {
        let dir = ScratchDir::new("gguf-claims");
        let path = dir.join("m.gguf");
        write_sample(&path);
        let f = GgufFile::open(&path).unwrap();
        let p = path.display().to_string();
        let claims = Claims::new(&f);
        let e = claims.take("w", &[3, 2]).unwrap_err();
        assert!(matches!(e, FormatError::WrongShape { .. }));
        let msg = e.to_string();
        assert!(
            msg.contains(&p) && msg.contains("'w'") && msg.contains("[3, 2]"),
            "{msg}"
        );
        let msg = claims.take("absent.weight", &[1]).unwrap_err().to_string();
        assert!(msg.contains(&p) && msg.contains("'absent.weight'"), "{msg}");
        claims.take("w", &[2, 3]).unwrap();
        claims.take("v", &[5]).unwrap();
        let msg = claims.finish().unwrap_err().to_string();
        assert!(
            msg.contains(&p) && msg.contains('q') && !msg.contains("w,"),
            "{msg}"
        );
    }

    #[test]
    fn real_smollm2_opens() {
        let Some(path) = cached_model(SMOLLM2) else {
            return;
        };
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.architecture(), Some("llama"));
        assert_eq!(
            f.arch_get("block_count").and_then(MetaValue::as_u64),
            Some(30)
        );
        assert_eq!(
            f.arch_get("embedding_length").and_then(MetaValue::as_u64),
            Some(576)
        );
        assert_eq!(
            f.get_array("tokenizer.ggml.tokens").map(<[_]>::len),
            Some(49152)
        );
        let emb = TensorSource::get(&f, "token_embd.weight").unwrap();
        assert_eq!(
            (emb.shape.as_slice(), emb.dtype),
            ([49152, 576].as_slice(), DType::Q8_0)
        );
        let q = TensorSource::get(&f, "blk.0.attn_q.weight").unwrap();
        assert_eq!(q.shape, vec![576, 576]);
        // 30 layers x 9 tensors + token_embd + output_norm (tied output).
        assert_eq!(f.tensor_infos().len(), 30 * 9 + 2);
    }
}
