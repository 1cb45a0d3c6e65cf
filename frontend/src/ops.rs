//! Tracing ops with PyTorch's names and semantics that are built from other traced ops (so they
//! decompose, differentiate and fuse like them): shape ops (`squeeze`, `unsqueeze`, `flatten`,
//! `split`, `chunk`, `pad`), `masked_fill`, `index_select`, `logsumexp`, `full`/`zeros`/`ones`,
//! and the network layers `batch_norm` (eval), `group_norm`, `avg_pool2d`,
//! `adaptive_avg_pool2d` (any output size) and `scaled_dot_product_attention` (additive or bool
//! mask, `is_causal`).
//!
//! Sizes these ops compute with are read as numbers (`shape()`), so under `jit` a symbolic dim
//! they split or pool is specialized. Bad arguments are trace errors naming the op and the sizes.

use crate::trace::{Traced, Tracer};
use minductor_ir::{broadcast_shapes, shape_string, DType, Dim, Op, Shape, SizeExpr};

fn normalize(dim: isize, rank: usize) -> Option<usize> {
    let d = if dim < 0 { dim + rank as isize } else { dim };
    (d >= 0 && (d as usize) < rank).then_some(d as usize)
}

impl Tracer {
    /// `torch.full(shape, value, dtype)`: a constant broadcast to `shape` (no memory of its own).
    #[track_caller]
    pub fn full(&self, shape: &[usize], value: f64, dtype: DType) -> Traced {
        let sizes: Vec<isize> = shape.iter().map(|&n| n as isize).collect();
        self.constant(value, dtype).expand(&sizes)
    }

    /// `torch.zeros(shape, dtype)`.
    #[track_caller]
    pub fn zeros(&self, shape: &[usize], dtype: DType) -> Traced {
        self.full(shape, 0.0, dtype)
    }

    /// `torch.ones(shape, dtype)`.
    #[track_caller]
    pub fn ones(&self, shape: &[usize], dtype: DType) -> Traced {
        self.full(shape, 1.0, dtype)
    }
}

impl Traced {
    /// `torch.full_like(self, value)`: a constant of `self`'s dtype broadcast to its shape
    /// (symbolic dims stay symbolic).
    #[track_caller]
    pub fn full_like(&self, value: f64) -> Traced {
        let constant = self.constant_like(value);
        constant.apply(
            Op::Expand {
                shape: self.ir_dims().into_iter().collect(),
            },
            &[&constant],
        )
    }

    /// `torch.zeros_like(self)`.
    #[track_caller]
    pub fn zeros_like(&self) -> Traced {
        self.full_like(0.0)
    }

    /// `torch.ones_like(self)`.
    #[track_caller]
    pub fn ones_like(&self) -> Traced {
        self.full_like(1.0)
    }

    /// `x.unsqueeze(dim)`: a new size-1 dim at `dim` (`-1`: last).
    #[track_caller]
    pub fn unsqueeze(&self, dim: isize) -> Traced {
        let Some(d) = normalize(dim, self.rank() + 1) else {
            return self.fail_msg(
                "unsqueeze",
                format!("dim {dim} out of range for rank {}", self.rank()),
            );
        };
        let mut shape: Shape = self.ir_dims().into_iter().collect();
        shape.insert(d, Dim::Static(1));
        self.reshape_dims(shape)
    }

    /// `x.squeeze(dim)`: drops `dim` if its size is 1 (else `x` unchanged, as PyTorch does).
    #[track_caller]
    pub fn squeeze(&self, dim: isize) -> Traced {
        let Some(d) = normalize(dim, self.rank()) else {
            return self.fail_msg(
                "squeeze",
                format!("dim {dim} out of range for rank {}", self.rank()),
            );
        };
        // An input symbol is at least 2 (`jit` guards it); a derived one is read as a number
        // (which specializes the symbols it is made of), as PyTorch's squeeze of a size-1 dim
        // would differ.
        let mut shape: Shape = self.ir_dims().into_iter().collect();
        let size_one = match shape[d] {
            Dim::Static(n) => n == 1,
            Dim::Sym(s) if s.is_derived() => self.shape()[d] == 1,
            Dim::Sym(_) => false,
        };
        if !size_one {
            return self.clone();
        }
        shape.remove(d);
        self.reshape_dims(shape)
    }

    /// `x.flatten(start, end)`: dims `start..=end` merged into one.
    #[track_caller]
    pub fn flatten(&self, start: isize, end: isize) -> Traced {
        let rank = self.rank().max(1);
        let (Some(s), Some(e)) = (normalize(start, rank), normalize(end, rank)) else {
            return self.fail_msg(
                "flatten",
                format!("dims {start}..{end} out of range for rank {}", self.rank()),
            );
        };
        if s > e {
            return self.fail_msg("flatten", format!("start {start} is after end {end}"));
        }
        let shape = self.ir_dims();
        if shape.is_empty() {
            return self.reshape(&[1]);
        }
        // The merged dim is the product of the merged ones: `2*s0` for `[2, s0]`.
        let Some(merged) = Dim::of_expr(&SizeExpr::product(&shape[s..=e])) else {
            return self.fail_msg("flatten", "a merged size is negative".into());
        };
        let mut out: Shape = shape[..s].iter().copied().collect();
        out.push(merged);
        out.extend(shape[e + 1..].iter().copied());
        self.reshape_dims(out)
    }

    /// `x.split(size, dim)`: consecutive pieces of `size` along `dim` (the last may be shorter).
    #[track_caller]
    pub fn split(&self, size: usize, dim: isize) -> Vec<Traced> {
        let Some(d) = normalize(dim, self.rank()) else {
            return vec![self.fail_msg(
                "split",
                format!("dim {dim} out of range for rank {}", self.rank()),
            )];
        };
        if size == 0 {
            return vec![self.fail_msg("split", "split size must be positive".into())];
        }
        let n = self.shape()[d];
        (0..n.div_ceil(size).max(1))
            .map(|i| {
                let (a, b) = (i * size, ((i + 1) * size).min(n));
                self.slice(d as isize, Some(a as isize), Some(b as isize), 1)
            })
            .collect()
    }

    /// `x.chunk(chunks, dim)`: pieces of `ceil(size / chunks)` along `dim`, as PyTorch.
    #[track_caller]
    pub fn chunk(&self, chunks: usize, dim: isize) -> Vec<Traced> {
        let Some(d) = normalize(dim, self.rank()) else {
            return vec![self.fail_msg(
                "chunk",
                format!("dim {dim} out of range for rank {}", self.rank()),
            )];
        };
        if chunks == 0 {
            return vec![self.fail_msg("chunk", "chunks must be positive".into())];
        }
        let n = self.shape()[d];
        self.split(n.div_ceil(chunks).max(1), d as isize)
    }

    /// `x.masked_fill(mask, value)`: `value` where the bool `mask` (broadcast) is true.
    #[track_caller]
    pub fn masked_fill(&self, mask: &Traced, value: f64) -> Traced {
        mask.where_(value, self)
    }

    /// `x.index_select(dim, index)`: the slices of `x` along `dim` at the i64 positions in the
    /// 1-d `index` (a position out of range is an error when the graph runs).
    #[track_caller]
    pub fn index_select(&self, dim: isize, index: &Traced) -> Traced {
        let Some(d) = normalize(dim, self.rank()) else {
            return self.fail_msg(
                "index_select",
                format!("dim {dim} out of range for rank {}", self.rank()),
            );
        };
        if index.rank() != 1 {
            return self.fail_msg(
                "index_select",
                format!("index must be 1-d, found {}", index.describe()),
            );
        }
        let shape = self.shape();
        let k = index.shape()[0];
        let mut column = vec![1isize; shape.len()];
        column[d] = k as isize;
        let mut full: Vec<isize> = shape.iter().map(|&n| n as isize).collect();
        full[d] = k as isize;
        self.gather(d as isize, &index.reshape(&column).expand(&full))
    }

    /// `torch.logsumexp(x, dims, keepdim)`: `m + log(Σ exp(x − m))` with `m` the (detached) max,
    /// 0 where the max is infinite (so rows of −inf give −inf, not NaN).
    #[track_caller]
    pub fn logsumexp(&self, dims: &[isize], keepdim: bool) -> Traced {
        let m = self.amax(dims, true).detach();
        let finite = m.abs().lt(f64::INFINITY);
        let m = finite.where_(&m, 0.0);
        let s = (self - &m).exp().sum(dims, true).log() + &m;
        if keepdim {
            s
        } else {
            let rank = self.rank();
            let reduced: Vec<usize> = if dims.is_empty() {
                (0..rank).collect()
            } else {
                dims.iter().filter_map(|&d| normalize(d, rank)).collect()
            };
            let kept: Vec<isize> = s
                .shape()
                .iter()
                .enumerate()
                .filter(|(i, _)| !reduced.contains(i))
                .map(|(_, &n)| n as isize)
                .collect();
            s.reshape(&kept)
        }
    }

    /// `F.pad(x, pad, value=value)`: `pad` lists (before, after) pairs from the last dim
    /// backwards; negative amounts crop.
    #[track_caller]
    pub fn pad(&self, pad: &[isize], value: f64) -> Traced {
        if !pad.len().is_multiple_of(2) || pad.len() / 2 > self.rank() {
            return self.fail_msg(
                "pad",
                format!(
                    "pad {pad:?} must be (before, after) pairs for at most {} dims",
                    self.rank()
                ),
            );
        }
        let mut out = self.clone();
        for (pair, amounts) in pad.chunks(2).enumerate() {
            let d = self.rank() - 1 - pair;
            let (before, after) = (amounts[0], amounts[1]);
            // Padding (not cropping) a symbolic dim keeps it symbolic: `s0` padded by 1 and 1
            // is the derived `s0 + 2`; the pieces take the other dims as they are.
            let dims = out.ir_dims();
            if before >= 0 && after >= 0 && dims[d].as_static().is_none() {
                let piece = |amount: isize| {
                    let mut shape: Shape = dims.iter().copied().collect();
                    shape[d] = Dim::Static(amount as usize);
                    out.constant_like(value).expand_dims(shape)
                };
                let mut pieces = Vec::new();
                if before > 0 {
                    pieces.push(piece(before));
                }
                pieces.push(out.clone());
                if after > 0 {
                    pieces.push(piece(after));
                }
                if pieces.len() > 1 {
                    let refs: Vec<&Traced> = pieces.iter().collect();
                    out = Traced::cat(&refs, d as isize);
                }
                continue;
            }
            let n = out.size_at(d) as isize;
            if before + after + n < 0 {
                return self.fail_msg(
                    "pad",
                    format!("padding {before}, {after} leaves dim {d} of size {n} negative"),
                );
            }
            // Crops first, then pads with the value.
            let start = (-before).max(0);
            let end = n - (-after).max(0);
            if start > 0 || end < n {
                out = out.slice(d as isize, Some(start), Some(end.max(start)), 1);
            }
            let mut pieces = Vec::new();
            let piece = |amount: isize| {
                let mut shape: Shape = out.ir_dims().into_iter().collect();
                shape[d] = Dim::Static(amount as usize);
                out.constant_like(value).expand_dims(shape)
            };
            if before > 0 {
                pieces.push(piece(before));
            }
            let middle = out.clone();
            if after > 0 {
                let tail = piece(after);
                pieces.push(middle);
                pieces.push(tail);
            } else {
                pieces.push(middle);
            }
            if pieces.len() > 1 {
                let refs: Vec<&Traced> = pieces.iter().collect();
                out = Traced::cat(&refs, d as isize);
            }
        }
        out
    }

    /// `F.batch_norm(x, mean, var, weight, bias, training=False, eps=eps)` over channel dim 1.
    #[track_caller]
    pub fn batch_norm(
        &self,
        mean: &Traced,
        var: &Traced,
        weight: Option<&Traced>,
        bias: Option<&Traced>,
        eps: f64,
    ) -> Traced {
        if self.rank() < 2 {
            return self.fail_msg(
                "batch_norm",
                format!("input must have a channel dim 1, found {}", self.describe()),
            );
        }
        let per_channel = |p: &Traced| {
            let mut shape = vec![1isize; self.rank() - 1];
            shape[0] = -1;
            p.reshape(&shape)
        };
        let mut y = (self - per_channel(mean)) * (per_channel(var) + eps).rsqrt();
        if let Some(w) = weight {
            y = y * per_channel(w);
        }
        if let Some(b) = bias {
            y = y + per_channel(b);
        }
        y
    }

    /// `F.group_norm(x, groups, weight, bias, eps)`: statistics over each group of channels (and
    /// all positions), then a per-channel affine.
    #[track_caller]
    pub fn group_norm(
        &self,
        groups: usize,
        weight: Option<&Traced>,
        bias: Option<&Traced>,
        eps: f64,
    ) -> Traced {
        let shape = self.shape();
        if shape.len() < 2 || groups == 0 || !shape[1].is_multiple_of(groups) {
            return self.fail_msg(
                "group_norm",
                format!(
                    "{} channels do not split into {groups} groups",
                    shape.get(1).unwrap_or(&0)
                ),
            );
        }
        let grouped = self.reshape(&[shape[0] as isize, groups as isize, -1]);
        let normalized = grouped.layer_norm(&[grouped.shape()[2]], None, None, eps);
        let dims: Vec<isize> = shape.iter().map(|&n| n as isize).collect();
        let mut y = normalized.reshape(&dims);
        let per_channel = |p: &Traced| {
            let mut s = vec![1isize; shape.len() - 1];
            s[0] = -1;
            p.reshape(&s)
        };
        if let Some(w) = weight {
            y = y * per_channel(w);
        }
        if let Some(b) = bias {
            y = y + per_channel(b);
        }
        y
    }

    /// `F.avg_pool2d(x, kernel)` with stride = kernel and no padding (rows and columns that do
    /// not fill a window are dropped, as PyTorch's floor mode does).
    #[track_caller]
    pub fn avg_pool2d(&self, kernel: usize) -> Traced {
        let shape = self.shape();
        if shape.len() != 4 || kernel == 0 || shape[2] < kernel || shape[3] < kernel {
            return self.fail_msg(
                "avg_pool2d",
                format!(
                    "a {kernel}x{kernel} window does not fit {} (expected [N, C, H, W])",
                    self.describe()
                ),
            );
        }
        let (n, c, h, w) = (shape[0], shape[1], shape[2] / kernel, shape[3] / kernel);
        let cropped = self.slice(2, None, Some((h * kernel) as isize), 1).slice(
            3,
            None,
            Some((w * kernel) as isize),
            1,
        );
        let k = kernel as isize;
        cropped
            .reshape(&[n as isize, c as isize, h as isize, k, w as isize, k])
            .mean(&[3, 5], false)
    }

    /// `F.adaptive_avg_pool2d(x, size)`: PyTorch's windows for any output size (a reshape-mean
    /// when the output size divides the input's).
    #[track_caller]
    pub fn adaptive_avg_pool2d(&self, size: (usize, usize)) -> Traced {
        // The batch and channel dims stay IR dims (a symbolic batch is not specialized).
        let (lead, spatial) = self.sizes_after(2);
        let fits = lead.len() == 2 && spatial.len() == 2 && size.0 > 0 && size.1 > 0;
        if !fits {
            return self.fail_msg(
                "adaptive_avg_pool2d",
                format!(
                    "needs [N, C, H, W] and a positive output size, found {} and {size:?}",
                    self.describe()
                ),
            );
        }
        let (h, w) = (spatial[0], spatial[1]);
        if h.is_multiple_of(size.0) && w.is_multiple_of(size.1) {
            // Equal windows: one reshape and one mean.
            let (kh, kw) = (h / size.0, w / size.1);
            let windows: Shape = [lead[0], lead[1]]
                .into_iter()
                .chain([size.0, kh, size.1, kw].map(Dim::Static))
                .collect();
            return self.reshape_dims(windows).mean(&[3, 5], false);
        }
        // PyTorch's windows: output i averages inputs floor(i·n/o) .. ceil((i+1)·n/o). A window
        // is a rectangle, so the mean is taken over rows, then over columns.
        let pool = |x: &Traced, dim: isize, n: usize, o: usize| -> Traced {
            let pieces: Vec<Traced> = (0..o)
                .map(|i| {
                    let (start, end) = (i * n / o, ((i + 1) * n).div_ceil(o));
                    x.slice(dim, Some(start as isize), Some(end as isize), 1)
                        .mean(&[dim], true)
                })
                .collect();
            let refs: Vec<&Traced> = pieces.iter().collect();
            Traced::cat(&refs, dim)
        };
        let rows = pool(self, 2, h, size.0);
        pool(&rows, 3, w, size.1)
    }

    /// `F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal)`:
    /// `softmax(q·kᵀ/√d + mask)·v` with an optional additive float mask broadcast to the scores
    /// (a bool mask keeps the positions where it is true, −inf elsewhere), and with `is_causal`
    /// the scores above the diagonal (key position > query position, the mask
    /// `ones(L, S).tril()`) set to −inf. The causal mask is compared from two `arange`s inside
    /// the softmax kernel. Compiled without a mask, with a float one or with a bool one (causal or
    /// not), `fuse` turns the expansion into one flash-attention step (no scores buffer).
    #[track_caller]
    pub fn scaled_dot_product_attention(
        &self,
        key: &Traced,
        value: &Traced,
        mask: Option<&Traced>,
        is_causal: bool,
    ) -> Traced {
        const OP: &str = "scaled_dot_product_attention";
        let (q, k, v) = (self.ir_dims(), key.ir_dims(), value.ir_dims());
        let fits = q.len() >= 2
            && k.len() >= 2
            && v.len() >= 2
            && q[q.len() - 1] == k[k.len() - 1]
            && k[k.len() - 2] == v[v.len() - 2];
        if !fits {
            return self.fail_msg(
                OP,
                format!(
                    "query {}, key {} and value {} must be [.., L, E], [.., S, E] and [.., S, Ev]",
                    shape_string(&q),
                    shape_string(&k),
                    shape_string(&v)
                ),
            );
        }
        // The head size scales the scores; only it is read as a number (L and S may stay
        // symbolic).
        let d = match q.last() {
            Some(Dim::Static(n)) => *n,
            _ => *self.shape().last().unwrap_or(&1),
        } as f64;
        let mut scores = self.matmul(&key.transpose(-1, -2)) * (1.0 / d.sqrt());
        if let Some(m) = mask {
            let target = scores.ir_dims();
            if broadcast_shapes(&m.ir_dims(), &target).as_deref() != Some(&target[..]) {
                return self.fail_msg(
                    OP,
                    format!(
                        "mask {} does not broadcast to the scores {}",
                        m.describe(),
                        shape_string(&target)
                    ),
                );
            }
            scores = if m.dtype() == Some(DType::Bool) {
                // A bool mask says which positions take part (PyTorch's convention).
                m.where_(&scores, f64::NEG_INFINITY)
            } else {
                scores + m
            };
        }
        if is_causal {
            match scores.diagonal_offsets("scaled_dot_product_attention") {
                Ok(offsets) => scores = scores.masked_fill(&offsets.gt(0.0), f64::NEG_INFINITY),
                Err(poisoned) => return poisoned,
            }
        }
        scores.softmax(-1).matmul(value)
    }
}
