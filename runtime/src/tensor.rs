//! `Tensor`: a shape, strides and an element type over shared, 64-byte aligned storage.
//!
//! Tensors are immutable once built and cheap to clone (the storage is reference counted).
//! Views (`permute`, `slice`) share storage and may be non-contiguous; kernels only ever see
//! contiguous buffers, so the runtime copies (`contiguous`) where a view is passed in.

use crate::block_cache::{self, CACHE_MIN_BYTES};
use crate::pages;
use crate::RuntimeError;
use half::{bf16, f16};
use minductor_ir::{checked_bytes, static_shape, DType, TensorType, MAX_TENSOR_BYTES};
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

/// Alignment of every buffer minductor allocates: one cache line, enough for any vector load.
pub const BUFFER_ALIGN: usize = 64;

/// A 64-byte aligned byte buffer.
pub struct Storage {
    ptr: NonNull<u8>,
    bytes: usize,
    /// Returned to the block cache on drop (see [`Storage::for_overwrite`] and `block_cache`).
    cached: bool,
}

// SAFETY: Storage is a plain heap allocation with no thread affinity; shared access is read-only
// except through `Tensor::data_mut`, which requires unique ownership of the Arc.
unsafe impl Send for Storage {}
unsafe impl Sync for Storage {}

impl Storage {
    /// `bytes` zero bytes. Panics if `bytes` exceeds `isize::MAX` (as `Vec` does) or memory
    /// runs out; use [`Storage::try_zeroed`] for sizes that come from input.
    pub fn zeroed(bytes: usize) -> Storage {
        Storage::try_zeroed(bytes).unwrap_or_else(|e| panic!("Storage::zeroed: {e}"))
    }

    /// `bytes` zero bytes, or a typed error if no allocation can be that large
    /// (`SizeOverflow`) or the allocator has no memory for it (`OutOfMemory`).
    pub fn try_zeroed(bytes: usize) -> Result<Storage, RuntimeError> {
        if bytes == 0 {
            // A dangling but aligned pointer: never dereferenced since there are no bytes.
            return Ok(Storage {
                ptr: NonNull::new(BUFFER_ALIGN as *mut u8).expect("BUFFER_ALIGN is not 0"),
                bytes: 0,
                cached: false,
            });
        }
        Layout::from_size_align(bytes, BUFFER_ALIGN).map_err(|_| {
            RuntimeError::SizeOverflow(format!("a buffer of {bytes} bytes cannot be allocated"))
        })?;
        // A failed allocation is a typed error, not an abort: the caller's call fails and the
        // process goes on to serve the next one.
        let ptr = pages::allocate_zeroed(bytes)
            .ok_or_else(|| RuntimeError::out_of_memory(bytes, "a buffer"))?;
        Ok(Storage {
            ptr,
            bytes,
            cached: false,
        })
    }

    /// A buffer whose every byte the caller will overwrite before reading it: a large one may be
    /// a recycled block holding old (initialised) bytes instead of zeros. Compiled programs make
    /// their outputs with it, since their kernels write every element of an output.
    pub fn for_overwrite(bytes: usize) -> Result<Storage, RuntimeError> {
        if bytes >= CACHE_MIN_BYTES {
            if let Some(ptr) = block_cache::take(bytes) {
                return Ok(Storage {
                    ptr,
                    bytes,
                    cached: true,
                });
            }
        }
        let mut storage = Storage::try_zeroed(bytes)?;
        storage.cached = bytes >= CACHE_MIN_BYTES;
        Ok(storage)
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Raw mutable pointer. Callers must make sure no one else reads the bytes meanwhile.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: ptr is valid for `bytes` bytes (or dangling with 0 bytes).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.bytes) }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if self.cached && block_cache::give(self.bytes, self.ptr).is_none() {
            return;
        }
        if self.bytes > 0 {
            // SAFETY: allocated in `try_zeroed` by `pages::allocate_zeroed(self.bytes)`.
            unsafe { pages::deallocate(self.ptr, self.bytes) }
        }
    }
}

mod sealed {
    /// Implemented only for the element types below: `Element` fixes the memory layout that
    /// `data_mut` hands out, so code outside this crate must not add types to it.
    pub trait Sealed {}
}

/// Rust types that can be tensor elements: f64, f32, f16, bf16, i64 and bool. Sealed: the
/// element type decides how `data_mut` reinterprets a tensor's bytes, so no other type may
/// implement it.
///
/// Invariant every constructor keeps: the bytes of a bool tensor are 0 or 1 (`from_bytes`
/// normalizes, `for_overwrite` zeroes bool buffers, compiled kernels store only 0 or 1), so a
/// `&mut [bool]` over them is valid, and safe code can only write `true` or `false` through it.
///
/// Code outside this crate cannot add a type (this does not compile: `Sealed` is private):
///
/// ```compile_fail,E0277
/// use minductor_ir::DType;
/// use minductor_runtime::Element;
/// #[derive(Clone, Copy, Default)]
/// struct Wide([u8; 64]);
/// impl Element for Wide {
///     const DTYPE: DType = DType::F32;
///     fn to_f64(self) -> f64 { 0.0 }
///     fn from_f64(_: f64) -> Self { Wide([0; 64]) }
/// }
/// ```
pub trait Element: sealed::Sealed + Copy + Default + 'static {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr, |$a:ident| $to:expr, |$b:ident| $from:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $d;
            fn to_f64(self) -> f64 {
                let $a = self;
                $to
            }
            fn from_f64($b: f64) -> Self {
                $from
            }
        }
    };
}
element!(f64, DType::F64, |x| x, |v| v);
element!(f32, DType::F32, |x| x as f64, |v| v as f32);
element!(f16, DType::F16, |x| x.to_f64(), |v| f16::from_f64(v));
element!(bf16, DType::BF16, |x| x.to_f64(), |v| bf16::from_f64(v));
element!(i64, DType::I64, |x| x as f64, |v| v as i64);
element!(bool, DType::Bool, |x| if x { 1.0 } else { 0.0 }, |v| v
    != 0.0);

#[derive(Clone)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    /// Strides in elements. Views may have zero strides (expand); never negative.
    strides: Vec<usize>,
    /// Offset of element `[0, 0, ...]` in elements.
    offset: usize,
    storage: Arc<Storage>,
}

pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    strides
}

/// Bytes of a contiguous `dtype` tensor of `shape`, or a typed error past `isize::MAX`.
pub fn byte_size(dtype: DType, shape: &[usize]) -> Result<usize, RuntimeError> {
    checked_bytes(shape.iter().copied(), dtype.size_bytes()).ok_or_else(|| {
        RuntimeError::SizeOverflow(format!(
            "a {dtype} tensor of shape {shape:?} holds more than {MAX_TENSOR_BYTES} bytes"
        ))
    })
}

impl Tensor {
    /// A zero-filled contiguous tensor. Panics if the size overflows (as `vec![0; n]` does);
    /// [`Tensor::try_zeros`] returns a typed error instead.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        Tensor::try_zeros(dtype, shape).unwrap_or_else(|e| panic!("Tensor::zeros: {e}"))
    }

    /// A zero-filled contiguous tensor, or a typed error if its byte size overflows.
    pub fn try_zeros(dtype: DType, shape: &[usize]) -> Result<Tensor, RuntimeError> {
        let bytes = byte_size(dtype, shape)?;
        Ok(Tensor::with_storage(
            dtype,
            shape,
            Storage::try_zeroed(bytes)?,
        ))
    }

    /// A contiguous tensor whose elements the caller overwrites before anyone reads them (see
    /// [`Storage::for_overwrite`]): unspecified but initialised values until then. A typed
    /// error if its byte size overflows.
    pub fn for_overwrite(dtype: DType, shape: &[usize]) -> Result<Tensor, RuntimeError> {
        let bytes = byte_size(dtype, shape)?;
        if dtype == DType::Bool {
            // A recycled block may hold any bytes; bool tensors hold only 0 and 1 (see
            // `Element`), even where a buggy writer left elements unwritten.
            return Ok(Tensor::with_storage(
                dtype,
                shape,
                Storage::try_zeroed(bytes)?,
            ));
        }
        Ok(Tensor::with_storage(
            dtype,
            shape,
            Storage::for_overwrite(bytes)?,
        ))
    }

    fn with_storage(dtype: DType, shape: &[usize], storage: Storage) -> Tensor {
        Tensor {
            dtype,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
            storage: Arc::new(storage),
        }
    }

    /// A contiguous tensor holding `data` in row-major order.
    pub fn from_vec<T: Element>(shape: &[usize], data: Vec<T>) -> Result<Tensor, RuntimeError> {
        let numel = byte_size(T::DTYPE, shape)? / T::DTYPE.size_bytes();
        if data.len() != numel {
            return Err(RuntimeError::Data(format!(
                "{} elements given for shape {:?} ({} expected)",
                data.len(),
                shape,
                numel
            )));
        }
        let mut t = Tensor::try_zeros(T::DTYPE, shape)?;
        t.data_mut::<T>()
            .expect("fresh tensor is unique")
            .copy_from_slice(&data);
        Ok(t)
    }

    /// A contiguous tensor from little-endian bytes (as stored in safetensors files).
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Tensor, RuntimeError> {
        let expected = byte_size(dtype, shape)?;
        if bytes.len() != expected {
            return Err(RuntimeError::Data(format!(
                "{} bytes given for {dtype}{:?} ({expected} expected)",
                bytes.len(),
                shape,
            )));
        }
        let t = Tensor::try_zeros(dtype, shape)?;
        // SAFETY: the fresh storage holds exactly `bytes.len()` bytes and is not shared yet.
        let dst = unsafe { std::slice::from_raw_parts_mut(t.storage.as_mut_ptr(), bytes.len()) };
        if dtype == DType::Bool {
            // Any nonzero byte reads as true; stored as 1 so bool tensors hold only 0 and 1.
            for (d, &b) in dst.iter_mut().zip(bytes) {
                *d = (b != 0) as u8;
            }
        } else {
            dst.copy_from_slice(bytes);
        }
        Ok(t)
    }

    /// A 0-d tensor.
    pub fn scalar<T: Element>(value: T) -> Tensor {
        Tensor::from_vec(&[], vec![value]).expect("one element for shape []")
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The IR type of this tensor (all dims static).
    pub fn tensor_type(&self) -> TensorType {
        TensorType::new(self.dtype, static_shape(&self.shape))
    }

    pub fn is_contiguous(&self) -> bool {
        self.offset == 0 && (self.numel() <= 1 || self.strides == contiguous_strides(&self.shape))
    }

    /// Element offsets of every logical element, in row-major order.
    fn element_offsets(&self) -> impl Iterator<Item = usize> + '_ {
        let numel = self.numel();
        let mut index = vec![0usize; self.rank()];
        (0..numel).map(move |n| {
            if n > 0 {
                for d in (0..index.len()).rev() {
                    index[d] += 1;
                    if index[d] < self.shape[d] {
                        break;
                    }
                    index[d] = 0;
                }
            }
            self.offset
                + index
                    .iter()
                    .zip(&self.strides)
                    .map(|(i, s)| i * s)
                    .sum::<usize>()
        })
    }

    /// A contiguous copy (or `self` if already contiguous). Panics if memory runs out; see
    /// [`Tensor::try_contiguous`].
    pub fn contiguous(&self) -> Tensor {
        self.try_contiguous()
            .unwrap_or_else(|e| panic!("Tensor::contiguous: {e}"))
    }

    /// A contiguous copy (or `self` if already contiguous), or `OutOfMemory`.
    pub fn try_contiguous(&self) -> Result<Tensor, RuntimeError> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let out = Tensor::try_zeros(self.dtype, &self.shape)?;
        let size = self.dtype.size_bytes();
        let src = self.storage.as_bytes();
        // SAFETY: `out` is fresh and unshared; each destination range is within its numel*size bytes.
        let dst =
            unsafe { std::slice::from_raw_parts_mut(out.storage.as_mut_ptr(), out.storage.len()) };
        for (n, off) in self.element_offsets().enumerate() {
            dst[n * size..(n + 1) * size].copy_from_slice(&src[off * size..(off + 1) * size]);
        }
        Ok(out)
    }

    /// Bytes of a contiguous tensor, row-major. Makes a contiguous copy first if needed.
    pub fn to_bytes(&self) -> Vec<u8> {
        let c = self.contiguous();
        c.storage.as_bytes()[..c.numel() * c.dtype.size_bytes()].to_vec()
    }

    /// The elements in row-major order, if `T` is this tensor's element type.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, RuntimeError> {
        if T::DTYPE != self.dtype {
            return Err(RuntimeError::Data(format!(
                "tensor is {}, not {}",
                self.dtype,
                T::DTYPE
            )));
        }
        if T::DTYPE == DType::Bool {
            // Stored bytes may be any u8; read them as u8 and test != 0 rather than as `bool`.
            return Ok(self.to_f64_vec().into_iter().map(T::from_f64).collect());
        }
        let c = self.contiguous();
        Ok(c.as_slice::<T>().to_vec())
    }

    /// The elements converted to f64, whatever the dtype (bool is 0/1).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let c = self.contiguous();
        match c.dtype {
            DType::F64 => c.as_slice::<f64>().to_vec(),
            DType::F32 => c.as_slice::<f32>().iter().map(|&x| x as f64).collect(),
            DType::F16 => c.as_slice::<f16>().iter().map(|x| x.to_f64()).collect(),
            DType::BF16 => c.as_slice::<bf16>().iter().map(|x| x.to_f64()).collect(),
            DType::I64 => c.as_slice::<i64>().iter().map(|&x| x as f64).collect(),
            DType::Bool => c
                .as_slice::<u8>()
                .iter()
                .map(|&x| (x != 0) as u8 as f64)
                .collect(),
        }
    }

    /// [`Tensor::to_f64_vec`], or `OutOfMemory` when the values (8 bytes each) or the
    /// contiguous copy they are read from cannot be allocated.
    pub fn try_to_f64_vec(&self) -> Result<Vec<f64>, RuntimeError> {
        let numel = self.numel();
        let mut values: Vec<f64> = Vec::new();
        values.try_reserve_exact(numel).map_err(|_| {
            RuntimeError::out_of_memory(numel.saturating_mul(8), "the values read as f64")
        })?;
        let c = self
            .try_contiguous()
            .map_err(|e| e.allocating("a contiguous copy of the values read"))?;
        match c.dtype {
            DType::F64 => values.extend_from_slice(c.as_slice::<f64>()),
            DType::F32 => values.extend(c.as_slice::<f32>().iter().map(|&x| x as f64)),
            DType::F16 => values.extend(c.as_slice::<f16>().iter().map(|x| x.to_f64())),
            DType::BF16 => values.extend(c.as_slice::<bf16>().iter().map(|x| x.to_f64())),
            DType::I64 => values.extend(c.as_slice::<i64>().iter().map(|&x| x as f64)),
            DType::Bool => values.extend(c.as_slice::<u8>().iter().map(|&x| (x != 0) as u8 as f64)),
        }
        Ok(values)
    }

    /// A contiguous tensor of `dtype` holding `values` (rounded to the dtype).
    pub fn from_f64(dtype: DType, shape: &[usize], values: &[f64]) -> Result<Tensor, RuntimeError> {
        match dtype {
            DType::F64 => Tensor::from_vec(shape, values.to_vec()),
            DType::F32 => Tensor::from_vec(shape, values.iter().map(|&v| v as f32).collect()),
            DType::F16 => {
                Tensor::from_vec(shape, values.iter().map(|&v| f16::from_f64(v)).collect())
            }
            DType::BF16 => {
                Tensor::from_vec(shape, values.iter().map(|&v| bf16::from_f64(v)).collect())
            }
            DType::I64 => Tensor::from_vec(shape, values.iter().map(|&v| v as i64).collect()),
            DType::Bool => Tensor::from_vec(shape, values.iter().map(|&v| v != 0.0).collect()),
        }
    }

    /// The elements of a contiguous tensor as a slice of `T` (any `T` of the same size as the
    /// dtype; bool tensors are read as `u8`).
    fn as_slice<T>(&self) -> &[T] {
        assert!(self.is_contiguous(), "as_slice needs a contiguous tensor");
        assert_eq!(
            std::mem::size_of::<T>(),
            self.dtype.size_bytes(),
            "element size mismatch"
        );
        // SAFETY: storage is 64-byte aligned and holds numel elements of this size; every bit
        // pattern is valid for the element types used here (bool is read as u8).
        unsafe { std::slice::from_raw_parts(self.storage.as_ptr() as *const T, self.numel()) }
    }

    /// Mutable elements of a contiguous tensor whose storage is not shared; `None` otherwise.
    pub fn data_mut<T: Element>(&mut self) -> Option<&mut [T]> {
        if T::DTYPE != self.dtype
            || !self.is_contiguous()
            || std::mem::size_of::<T>() != self.dtype.size_bytes()
        {
            return None;
        }
        let numel = self.numel();
        let storage = Arc::get_mut(&mut self.storage)?;
        if storage.len() < numel * std::mem::size_of::<T>() {
            return None;
        }
        // SAFETY: unique access (`Arc::get_mut`) to a 64-byte aligned buffer of at least numel
        // elements of T (checked just above); `T` is one of the sealed element types, for which
        // every byte pattern the constructors leave is valid (bool bytes are 0 or 1, see
        // `Element`).
        Some(unsafe { std::slice::from_raw_parts_mut(storage.as_mut_ptr() as *mut T, numel) })
    }

    /// Pointer to element `[0, ...]`, for handing contiguous inputs to compiled code.
    pub fn data_ptr(&self) -> *const u8 {
        // SAFETY: offset is within the storage by construction of every view.
        unsafe {
            self.storage
                .as_ptr()
                .add(self.offset * self.dtype.size_bytes())
        }
    }

    /// Mutable pointer for a tensor this caller just allocated and owns uniquely.
    pub fn data_mut_ptr(&mut self) -> Option<*mut u8> {
        let offset = self.offset * self.dtype.size_bytes();
        Arc::get_mut(&mut self.storage).map(|s| {
            // SAFETY: as in `data_ptr`: the offset is inside the storage by construction of
            // every view (a tensor starts at 0; `slice` checks its range before moving it).
            unsafe { s.as_mut_ptr().add(offset) }
        })
    }

    /// A view with dims reordered (shares storage).
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor, RuntimeError> {
        let mut sorted = perm.to_vec();
        sorted.sort_unstable();
        if sorted != (0..self.rank()).collect::<Vec<_>>() {
            return Err(RuntimeError::Data(format!(
                "{perm:?} is not a permutation of {} dims",
                self.rank()
            )));
        }
        let mut t = self.clone();
        t.shape = perm.iter().map(|&p| self.shape[p]).collect();
        t.strides = perm.iter().map(|&p| self.strides[p]).collect();
        Ok(t)
    }

    /// A view of `start..end` with `step` along `dim` (shares storage).
    pub fn slice(
        &self,
        dim: usize,
        start: usize,
        end: usize,
        step: usize,
    ) -> Result<Tensor, RuntimeError> {
        if dim >= self.rank() || step == 0 || start > end || end > self.shape[dim] {
            return Err(RuntimeError::Data(format!(
                "slice {start}:{end}:{step} of dim {dim} invalid for shape {:?}",
                self.shape
            )));
        }
        let mut t = self.clone();
        if end > start {
            t.offset += start * self.strides[dim];
        }
        t.shape[dim] = (end - start).div_ceil(step);
        t.strides[dim] *= step;
        Ok(t)
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let values = self.to_f64_vec();
        let shown: Vec<String> = values.iter().take(8).map(|v| format!("{v:.4}")).collect();
        let more = if values.len() > 8 { ", ..." } else { "" };
        write!(
            f,
            "Tensor({}{:?}, [{}{more}])",
            self.dtype,
            self.shape,
            shown.join(", ")
        )
    }
}
