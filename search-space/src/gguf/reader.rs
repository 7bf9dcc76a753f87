//! The GGUF wire format read defensively: every count and length is checked against a limit and against
//! the bytes left in the file before anything is allocated or looped over, and every failure is a
//! [`GgufError`] that says what was being read and where.

use super::error::GgufError;
use super::limits::{
    MAX_ARRAY_COUNT, MAX_DIMS, MAX_KV_COUNT, MAX_METADATA_BYTES, MAX_STRING_LEN, MAX_TENSOR_COUNT,
    MAX_TENSOR_NAME_LEN,
};
use super::tables::ggml_type;
use std::collections::{HashMap, HashSet};
use std::io::{self, Read};
use std::path::PathBuf;

/// Integer arrays of at most this many elements are kept when their key asks for contents (per-layer
/// head counts); longer ones are only counted.
const MAX_KEPT_ARRAY: u64 = 65_536;

/// A GGUF metadata value type, numbered as in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    fn from_u32(n: u32) -> Option<Self> {
        use ValueType::*;
        Some(match n {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub(super) fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// Bytes per value for the fixed-size types.
    fn fixed_size(self) -> Option<u64> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    fn is_integer(self) -> bool {
        use ValueType::*;
        matches!(self, U8 | I8 | U16 | I16 | U32 | I32 | U64 | I64)
    }
}

/// A metadata value. Only what the inspector uses is kept: strings for the keys that ask for them, and
/// arrays as their element type and length (plus the contents of short integer arrays that are asked for).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value {
    Int(ValueType, i128),
    Float(ValueType, f64),
    Bool(bool),
    /// `None` when the string was checked but not kept.
    Str(Option<String>),
    Array {
        elem: ValueType,
        count: u64,
        ints: Option<Vec<i128>>,
    },
}

impl Value {
    /// How a wrong-type message names this value, e.g. "a string" or "an array of u32".
    pub(super) fn describe(&self) -> String {
        match self {
            Value::Int(ty, v) => format!("the {} value {v}", ty.name()),
            Value::Float(ty, v) => format!("the {} value {v}", ty.name()),
            Value::Bool(b) => format!("the bool value {b}"),
            Value::Str(_) => "a string".to_string(),
            Value::Array { elem, count, .. } => format!("an array of {count} {}", elem.name()),
        }
    }
}

/// A tensor as described in the file, validated except for where its data lies.
pub(super) struct RawTensor {
    pub name: String,
    pub ggml_type: u32,
    pub dims: Vec<u64>,
    pub offset: u64,
    pub elements: u64,
    pub bytes: u64,
}

/// A reader that knows its position, the file's size, and how to word a failure.
pub(super) struct Reader<R> {
    inner: R,
    pos: u64,
    file_size: u64,
    path: PathBuf,
    /// What the fields being read belong to, e.g. "key 'general.name'", for error messages.
    context: Option<String>,
    scratch: Vec<u8>,
}

impl<R: Read> Reader<R> {
    pub(super) fn new(inner: R, file_size: u64, path: PathBuf) -> Self {
        Reader {
            inner,
            pos: 0,
            file_size,
            path,
            context: None,
            scratch: Vec::new(),
        }
    }

    pub(super) fn pos(&self) -> u64 {
        self.pos
    }

    pub(super) fn file_size(&self) -> u64 {
        self.file_size
    }

    fn remaining(&self) -> u64 {
        self.file_size.saturating_sub(self.pos)
    }

    fn what(&self, what: &str) -> String {
        match &self.context {
            Some(c) => format!("{what} of {c}"),
            None => what.to_string(),
        }
    }

    pub(super) fn truncated(&self, what: &str, offset: u64) -> GgufError {
        GgufError::Truncated {
            path: self.path.clone(),
            what: self.what(what),
            offset,
        }
    }

    fn absurd(&self, what: &str, count: u64, limit: u64) -> GgufError {
        GgufError::AbsurdCount {
            path: self.path.clone(),
            what: self.what(what),
            count,
            limit,
        }
    }

    fn io_error(&self, e: io::Error, what: &str, offset: u64) -> GgufError {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            self.truncated(what, offset)
        } else {
            GgufError::Unreadable {
                path: self.path.clone(),
                source: e,
            }
        }
    }

    /// Fails with `Truncated` unless `n` more bytes are left in the file.
    fn need(&mut self, n: u64, what: &str) -> Result<(), GgufError> {
        if n > self.remaining() {
            return Err(self.truncated(what, self.pos));
        }
        Ok(())
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut buf = [0u8; N];
        let start = self.pos;
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| self.io_error(e, what, start))?;
        self.pos += N as u64;
        Ok(buf)
    }

    /// Reads up to 4 bytes: a short file is reported as not-GGUF (or truncated) by the caller.
    pub(super) fn magic(&mut self) -> Result<Vec<u8>, GgufError> {
        let mut buf = Vec::with_capacity(4);
        (&mut self.inner)
            .take(4)
            .read_to_end(&mut buf)
            .map_err(|e| GgufError::Unreadable {
                path: self.path.clone(),
                source: e,
            })?;
        self.pos += buf.len() as u64;
        Ok(buf)
    }

    pub(super) fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.bytes::<4>(what).map(u32::from_le_bytes)
    }

    pub(super) fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.bytes::<8>(what).map(u64::from_le_bytes)
    }

    /// Discards `n` bytes, which must be in the file.
    fn skip(&mut self, n: u64, what: &str) -> Result<(), GgufError> {
        self.need(n, what)?;
        let start = self.pos;
        let copied = io::copy(&mut (&mut self.inner).take(n), &mut io::sink())
            .map_err(|e| self.io_error(e, what, start))?;
        self.pos += copied;
        if copied < n {
            return Err(self.truncated(what, start));
        }
        Ok(())
    }

    /// Reads a length-prefixed string. With `keep == false` the bytes are skipped unchecked.
    fn string(&mut self, what: &str, keep: bool) -> Result<Option<String>, GgufError> {
        let len = self.u64(&format!("the length of {what}"))?;
        if len > MAX_STRING_LEN {
            return Err(self.absurd(&format!("the length of {what}"), len, MAX_STRING_LEN));
        }
        if !keep {
            self.skip(len, what)?;
            return Ok(None);
        }
        self.need(len, what)?;
        let start = self.pos;
        // Bounded by MAX_STRING_LEN and by the bytes left in the file.
        self.scratch.resize(len as usize, 0);
        if let Err(e) = self.inner.read_exact(&mut self.scratch) {
            return Err(self.io_error(e, what, start));
        }
        self.pos += len;
        match std::str::from_utf8(&self.scratch) {
            Ok(s) => Ok(Some(s.to_string())),
            Err(e) => Err(GgufError::BadString {
                path: self.path.clone(),
                offset: start + e.valid_up_to() as u64,
            }),
        }
    }

    fn scalar(&mut self, ty: ValueType) -> Result<Value, GgufError> {
        use ValueType::*;
        const W: &str = "the value";
        Ok(match ty {
            U8 => Value::Int(ty, self.bytes::<1>(W)?[0].into()),
            I8 => Value::Int(ty, i8::from_le_bytes(self.bytes::<1>(W)?).into()),
            U16 => Value::Int(ty, u16::from_le_bytes(self.bytes::<2>(W)?).into()),
            I16 => Value::Int(ty, i16::from_le_bytes(self.bytes::<2>(W)?).into()),
            U32 => Value::Int(ty, u32::from_le_bytes(self.bytes::<4>(W)?).into()),
            I32 => Value::Int(ty, i32::from_le_bytes(self.bytes::<4>(W)?).into()),
            U64 => Value::Int(ty, u64::from_le_bytes(self.bytes::<8>(W)?).into()),
            I64 => Value::Int(ty, i64::from_le_bytes(self.bytes::<8>(W)?).into()),
            F32 => Value::Float(ty, f32::from_le_bytes(self.bytes::<4>(W)?).into()),
            F64 => Value::Float(ty, f64::from_le_bytes(self.bytes::<8>(W)?)),
            Bool => Value::Bool(self.bytes::<1>(W)?[0] != 0),
            String | Array => unreachable!("scalar() is only called for fixed-size types"),
        })
    }

    pub(super) fn header(&mut self) -> Result<(u32, u64, u64), GgufError> {
        let version = self.u32("the GGUF version")?;
        if version != 0 && version & 0xFFFF == 0 {
            return Err(GgufError::BigEndian {
                path: self.path.clone(),
            });
        }
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion {
                path: self.path.clone(),
                version,
            });
        }
        let tensor_count = self.u64("the tensor count")?;
        if tensor_count > MAX_TENSOR_COUNT {
            return Err(self.absurd("the tensor count", tensor_count, MAX_TENSOR_COUNT));
        }
        let kv_count = self.u64("the metadata key count")?;
        if kv_count > MAX_KV_COUNT {
            return Err(self.absurd("the metadata key count", kv_count, MAX_KV_COUNT));
        }
        // Each key-value pair takes at least 13 bytes: a key length, a type and a one-byte value.
        self.need(
            kv_count.saturating_mul(13),
            &format!("the metadata ({kv_count} key-value pairs declared)"),
        )?;
        Ok((version, tensor_count, kv_count))
    }

    /// Reads `kv_count` key-value pairs. `keep(key)` says whether a string's text or a short integer
    /// array's contents are wanted; everything else is checked and counted but not stored.
    pub(super) fn metadata(
        &mut self,
        kv_count: u64,
        keep: impl Fn(&str) -> bool,
    ) -> Result<HashMap<String, Value>, GgufError> {
        let mut map = HashMap::with_capacity(kv_count.min(1024) as usize);
        for i in 0..kv_count {
            self.context = Some(format!("metadata key number {}", i + 1));
            let key = self.string("the key", true)?.unwrap_or_default();
            if key.is_empty() {
                return Err(self.bad_metadata(&key, "is empty".into()));
            }
            if map.contains_key(&key) {
                return Err(self.bad_metadata(&key, "appears twice".into()));
            }
            self.context = Some(format!("key '{key}'"));
            let value = self.value(&key, keep(&key))?;
            if self.pos > MAX_METADATA_BYTES {
                return Err(self.absurd("the size of the metadata", self.pos, MAX_METADATA_BYTES));
            }
            map.insert(key, value);
        }
        self.context = None;
        Ok(map)
    }

    fn bad_metadata(&self, key: &str, reason: String) -> GgufError {
        GgufError::BadMetadata {
            path: self.path.clone(),
            key: key.to_string(),
            reason,
        }
    }

    fn bad_tensor(&self, name: &str, reason: String) -> GgufError {
        GgufError::BadTensor {
            path: self.path.clone(),
            name: name.to_string(),
            reason,
        }
    }

    fn value_type(&mut self, key: &str) -> Result<ValueType, GgufError> {
        let n = self.u32("the value type")?;
        ValueType::from_u32(n)
            .ok_or_else(|| self.bad_metadata(key, format!("has unknown value type {n}")))
    }

    fn value(&mut self, key: &str, keep: bool) -> Result<Value, GgufError> {
        let ty = self.value_type(key)?;
        match ty {
            ValueType::String => Ok(Value::Str(self.string("the value", true)?.filter(|_| keep))),
            ValueType::Array => self.array(key, keep),
            _ => self.scalar(ty),
        }
    }

    fn array(&mut self, key: &str, keep: bool) -> Result<Value, GgufError> {
        let elem = self.value_type(key)?;
        if elem == ValueType::Array {
            return Err(self.bad_metadata(
                key,
                "is an array of arrays, which llama.cpp does not read".into(),
            ));
        }
        let count = self.u64("the array length")?;
        if count > MAX_ARRAY_COUNT {
            return Err(self.absurd("the array length", count, MAX_ARRAY_COUNT));
        }
        // A string takes at least its 8-byte length.
        let min_size = elem.fixed_size().unwrap_or(8);
        let total = count.saturating_mul(min_size);
        if self.pos.saturating_add(total) > MAX_METADATA_BYTES {
            return Err(self.absurd(
                "the size of the metadata",
                self.pos.saturating_add(total),
                MAX_METADATA_BYTES,
            ));
        }
        self.need(
            total,
            &format!("the array ({count} {} elements)", elem.name()),
        )?;
        let mut ints = None;
        if elem == ValueType::String {
            for _ in 0..count {
                self.string("an array element", false)?;
                if self.pos > MAX_METADATA_BYTES {
                    return Err(self.absurd(
                        "the size of the metadata",
                        self.pos,
                        MAX_METADATA_BYTES,
                    ));
                }
            }
        } else if keep && elem.is_integer() && count <= MAX_KEPT_ARRAY {
            let mut v = Vec::with_capacity(count as usize);
            for _ in 0..count {
                if let Value::Int(_, n) = self.scalar(elem)? {
                    v.push(n);
                }
            }
            ints = Some(v);
        } else {
            self.skip(total, "the array")?;
        }
        Ok(Value::Array { elem, count, ints })
    }

    /// Reads and validates `count` tensor descriptions (the checks llama.cpp's gguf reader makes).
    pub(super) fn tensor_infos(&mut self, count: u64) -> Result<Vec<RawTensor>, GgufError> {
        // name length 8 + n_dims 4 + type 4 + offset 8
        self.need(
            count.saturating_mul(24),
            &format!("the tensor descriptions ({count} declared)"),
        )?;
        let mut tensors = Vec::with_capacity(count.min(4096) as usize);
        let mut seen = HashSet::new();
        for i in 0..count {
            self.context = Some(format!("tensor number {}", i + 1));
            let name = self.string("the name", true)?.unwrap_or_default();
            self.context = Some(format!("tensor '{name}'"));
            if name.len() > MAX_TENSOR_NAME_LEN {
                let reason = format!(
                    "has a name of {} bytes, longer than llama.cpp's limit of {MAX_TENSOR_NAME_LEN}",
                    name.len()
                );
                return Err(self.bad_tensor(&name, reason));
            }
            if !seen.insert(name.clone()) {
                return Err(self.bad_tensor(&name, "appears twice".into()));
            }
            let n_dims = self.u32("the number of dimensions")?;
            if n_dims as usize > MAX_DIMS {
                let reason = format!("has {n_dims} dimensions; ggml allows at most {MAX_DIMS}");
                return Err(self.bad_tensor(&name, reason));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(self.u64("the dimensions")?);
            }
            let ty = self.u32("the ggml type")?;
            let offset = self.u64("the data offset")?;
            let (elements, bytes) =
                tensor_size(&dims, ty).map_err(|reason| self.bad_tensor(&name, reason))?;
            tensors.push(RawTensor {
                name,
                ggml_type: ty,
                dims,
                offset,
                elements,
                bytes,
            });
        }
        self.context = None;
        Ok(tensors)
    }
}

/// Element count and byte size of a tensor, or why its shape or type is invalid.
fn tensor_size(dims: &[u64], ty: u32) -> Result<(u64, u64), String> {
    let t = ggml_type(ty)
        .ok_or_else(|| format!("has unknown ggml type {ty} (a newer llama.cpp may know it)"))?;
    let mut elements: u64 = 1;
    for &d in dims {
        if d > i64::MAX as u64 {
            return Err(format!(
                "has a dimension of {d}, more than ggml can represent"
            ));
        }
        elements = elements
            .checked_mul(d)
            .filter(|n| *n <= i64::MAX as u64)
            .ok_or_else(|| format!("has shape {dims:?}, whose element count overflows"))?;
    }
    let row = dims.first().copied().unwrap_or(1);
    if row % t.block_size != 0 {
        return Err(format!(
            "has rows of {row} elements, not a multiple of the {} block size {}",
            t.name, t.block_size
        ));
    }
    let bytes = (elements / t.block_size)
        .checked_mul(t.type_size)
        .ok_or_else(|| format!("has shape {dims:?}, whose size in bytes overflows"))?;
    Ok((elements, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_block_layout() {
        assert_eq!(
            tensor_size(&[4096, 4096], 0),
            Ok((4096 * 4096, 4096 * 4096 * 4))
        );
        assert_eq!(tensor_size(&[256, 2], 12), Ok((512, 2 * 144)));
        assert_eq!(tensor_size(&[], 0), Ok((1, 4)));
        assert!(tensor_size(&[100], 12).is_err());
        assert!(tensor_size(&[1 << 40, 1 << 40], 0).is_err());
        assert!(tensor_size(&[u64::MAX], 0).is_err());
        assert!(tensor_size(&[32], 4).is_err());
    }
}
