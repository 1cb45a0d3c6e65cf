//! Convolution and max pooling with PyTorch's names and semantics (`F.conv2d`, `F.conv1d`,
//! `F.max_pool2d`), built from the op set so that they decompose, differentiate and fuse like it.
//!
//! - `conv2d` is a GEMM with an `im2col` (`F.unfold`): the (zero-padded) input's `KH·KW`
//!   shifted, strided windows side by side, `[N, C·KH·KW, OH·OW]`, which, seen as `[N, groups,
//!   C/groups·KH·KW, OH·OW]`, is the right operand of one batched GEMM with the weight `[groups,
//!   O/groups, C/groups·KH·KW]`; the bias is a pointwise consumer of the GEMM's output. The
//!   compiled GEMM packs its panels from the input directly (implicit GEMM: no im2col buffer);
//!   where that does not apply, `decompose` expands the im2col into pads, slices and a `cat`. A 1x1 convolution
//!   with stride 1 and no padding multiplies the input in place (no copy). A depthwise
//!   convolution (one input and one output channel per group) is instead one pointwise kernel
//!   summing `KH·KW` products of shifted windows with the weights.
//! - `conv1d` is `conv2d` over a height of 1.
//! - `max_pool2d` pads with −inf and takes the `maximum` of its `KH·KW` strided windows, and
//!   `avg_pool2d_with` pads with zeros and sums them: one pointwise kernel each.
//!
//! Bad sizes (channels or groups that do not divide, a window larger than the padded input, a
//! weight of the wrong rank) are trace errors naming the op and the sizes.

use crate::trace::Traced;
use minductor_ir::{Dim, Op, Window2d};
use smallvec::smallvec;

/// `stride`, `padding`, `dilation` (the same along every spatial dim) and `groups` of a
/// convolution; `Default` is PyTorch's (1, 0, 1, 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvOptions {
    pub stride: usize,
    pub padding: usize,
    pub dilation: usize,
    pub groups: usize,
}

impl Default for ConvOptions {
    fn default() -> Self {
        ConvOptions {
            stride: 1,
            padding: 0,
            dilation: 1,
            groups: 1,
        }
    }
}

impl ConvOptions {
    pub fn stride(self, stride: usize) -> Self {
        ConvOptions { stride, ..self }
    }
    pub fn padding(self, padding: usize) -> Self {
        ConvOptions { padding, ..self }
    }
    pub fn dilation(self, dilation: usize) -> Self {
        ConvOptions { dilation, ..self }
    }
    pub fn groups(self, groups: usize) -> Self {
        ConvOptions { groups, ..self }
    }
}

/// `stride` (default: the kernel size), `padding`, `dilation` and `ceil_mode` of a max pooling,
/// as `F.max_pool2d`'s arguments: `PoolOptions::new(3).stride(2).padding(1).ceil_mode()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolOptions {
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
    pub dilation: usize,
    /// The output size rounds up (a last, partial window), as PyTorch's `ceil_mode=True`.
    pub ceil_mode: bool,
}

impl PoolOptions {
    /// A `kernel`x`kernel` window at stride `kernel`, no padding, dilation 1, floor mode.
    pub fn new(kernel: usize) -> Self {
        PoolOptions {
            kernel,
            stride: kernel,
            padding: 0,
            dilation: 1,
            ceil_mode: false,
        }
    }
    pub fn stride(self, stride: usize) -> Self {
        PoolOptions { stride, ..self }
    }
    pub fn padding(self, padding: usize) -> Self {
        PoolOptions { padding, ..self }
    }
    pub fn dilation(self, dilation: usize) -> Self {
        PoolOptions { dilation, ..self }
    }
    pub fn ceil_mode(self) -> Self {
        PoolOptions {
            ceil_mode: true,
            ..self
        }
    }
}

/// PyTorch's `pooling_output_shape` for one dim: `None` when no window fits.
fn pooled_size(size: usize, options: PoolOptions) -> Option<usize> {
    let PoolOptions {
        kernel,
        stride,
        padding,
        dilation,
        ceil_mode,
    } = options;
    let span = (kernel.checked_sub(1)?).checked_mul(dilation)? + 1;
    let room = (size + 2 * padding).checked_sub(span)?;
    let mut out = if ceil_mode {
        room.div_ceil(stride) + 1
    } else {
        room / stride + 1
    };
    // The last window must start inside the input or its left padding.
    if ceil_mode && (out - 1) * stride >= size + padding {
        out -= 1;
    }
    Some(out)
}

/// Per spatial dim (height, width) sizes of a convolution or pooling window.
#[derive(Clone, Copy)]
pub(crate) struct Window {
    pub(crate) stride: (usize, usize),
    pub(crate) padding: (usize, usize),
    pub(crate) dilation: (usize, usize),
}

impl Traced {
    /// `F.conv2d(x, weight, bias, stride, padding, dilation, groups)` on `x: [N, C, H, W]`,
    /// `weight: [O, C / groups, KH, KW]`, `bias: [O]`.
    #[track_caller]
    pub fn conv2d(&self, weight: &Traced, bias: Option<&Traced>, options: ConvOptions) -> Traced {
        let ConvOptions {
            stride: s,
            padding: p,
            dilation: d,
            groups,
        } = options;
        let window = Window {
            stride: (s, s),
            padding: (p, p),
            dilation: (d, d),
        };
        self.convolution("conv2d", weight, bias, window, groups)
    }

    /// `F.conv1d(x, weight, bias, stride, padding, dilation, groups)` on `x: [N, C, L]`,
    /// `weight: [O, C / groups, K]`, `bias: [O]`.
    #[track_caller]
    pub fn conv1d(&self, weight: &Traced, bias: Option<&Traced>, options: ConvOptions) -> Traced {
        if self.rank() != 3 || weight.rank() != 3 {
            return self.fail_msg(
                "conv1d",
                format!(
                    "expected x [N, C, L] and weight [O, C/groups, K], found {} and {}",
                    self.describe(),
                    weight.describe()
                ),
            );
        }
        let ConvOptions {
            stride: s,
            padding: p,
            dilation: d,
            groups,
        } = options;
        let window = Window {
            stride: (1, s),
            padding: (0, p),
            dilation: (1, d),
        };
        self.unsqueeze(2)
            .convolution("conv1d", &weight.unsqueeze(2), bias, window, groups)
            .squeeze(2)
    }

    /// The shifted, strided window of the (padded) `self` that kernel offset `(kh, kw)` reads:
    /// `[N, C, out_h, out_w]`.
    #[track_caller]
    fn window_at(&self, kh: usize, kw: usize, w: Window, out: (usize, usize)) -> Traced {
        let (h0, w0) = (kh * w.dilation.0, kw * w.dilation.1);
        let h_end = h0 + (out.0 - 1) * w.stride.0 + 1;
        let w_end = w0 + (out.1 - 1) * w.stride.1 + 1;
        self.slice(2, Some(h0 as isize), Some(h_end as isize), w.stride.0)
            .slice(3, Some(w0 as isize), Some(w_end as isize), w.stride.1)
    }

    /// The output size of a window sliding over `[.., H, W]`, or a trace error when the
    /// (dilated) window does not fit the padded input.
    #[track_caller]
    fn output_size(
        &self,
        op: &str,
        kernel: (usize, usize),
        w: Window,
    ) -> Result<(usize, usize), Traced> {
        // Only the spatial sizes are read as numbers: a symbolic batch dim stays symbolic.
        let (_, spatial) = self.sizes_after(2);
        let (h, wd) = (spatial[0], spatial[1]);
        if w.stride.0 == 0 || w.stride.1 == 0 || w.dilation.0 == 0 || w.dilation.1 == 0 {
            return Err(self.fail_msg(op, "stride and dilation must be positive".into()));
        }
        let padded = (h + 2 * w.padding.0, wd + 2 * w.padding.1);
        let span = (
            (kernel.0.max(1) - 1) * w.dilation.0 + 1,
            (kernel.1.max(1) - 1) * w.dilation.1 + 1,
        );
        if kernel.0 == 0 || kernel.1 == 0 || span.0 > padded.0 || span.1 > padded.1 {
            return Err(self.fail_msg(
                op,
                format!(
                    "a {}x{} window (dilated: {}x{}) is larger than the padded input {}x{} of {}",
                    kernel.0,
                    kernel.1,
                    span.0,
                    span.1,
                    padded.0,
                    padded.1,
                    self.describe()
                ),
            ));
        }
        Ok((
            (padded.0 - span.0) / w.stride.0 + 1,
            (padded.1 - span.1) / w.stride.1 + 1,
        ))
    }

    #[track_caller]
    pub(crate) fn convolution(
        &self,
        op: &str,
        weight: &Traced,
        bias: Option<&Traced>,
        w: Window,
        groups: usize,
    ) -> Traced {
        if self.rank() != 4 || weight.rank() != 4 {
            return self.fail_msg(
                op,
                format!(
                    "expected x [N, C, H, W] and weight [O, C/groups, KH, KW], found {} and {}",
                    self.describe(),
                    weight.describe()
                ),
            );
        }
        // The batch dim stays an IR dim (it may be symbolic); channels and the spatial sizes
        // are read as numbers.
        let ((batch, xs), ws) = (self.sizes_after(1), weight.shape());
        let n = batch[0];
        let c = xs[0];
        let (o, cg, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
        if groups == 0 || c % groups != 0 || o % groups != 0 || cg * groups != c {
            return self.fail_msg(
                op,
                format!(
                    "{c} input channels and {o} output channels do not split into {groups} \
                     groups of the weight's {cg} input channels (x {}, weight {})",
                    self.describe(),
                    weight.describe()
                ),
            );
        }
        if let Some(b) = bias {
            if b.shape() != [o] {
                return self.fail_msg(op, format!("bias {} must be [{o}]", b.describe()));
            }
        }
        let (oh, ow) = match self.output_size(op, (kh, kw), w) {
            Ok(size) => size,
            Err(t) => return t,
        };
        let (ph, pw) = (w.padding.0 as isize, w.padding.1 as isize);
        let out = if cg == 1 && o == c {
            let padded = if ph > 0 || pw > 0 {
                self.pad(&[pw, pw, ph, ph], 0.0)
            } else {
                self.clone()
            };
            // Depthwise: Σ over kernel offsets of a window times its per-channel weight.
            let mut acc: Option<Traced> = None;
            for i in 0..kh {
                for j in 0..kw {
                    let tap = weight
                        .slice(2, Some(i as isize), Some(i as isize + 1), 1)
                        .slice(3, Some(j as isize), Some(j as isize + 1), 1)
                        .reshape(&[c as isize, 1, 1]);
                    let term = padded.window_at(i, j, w, (oh, ow)) * tap;
                    acc = Some(match acc {
                        None => term,
                        Some(a) => a + term,
                    });
                }
            }
            acc.expect("a kernel has at least one offset")
        } else {
            let taps = kh * kw;
            let direct = taps == 1 && (oh, ow) == (xs[1], xs[2]) && ph == 0 && pw == 0;
            let columns = if direct {
                self.reshape_dims(smallvec![
                    n,
                    Dim::Static(groups),
                    Dim::Static(cg),
                    Dim::Static(oh * ow)
                ])
            } else {
                let window = Window2d {
                    kernel: [kh, kw],
                    stride: [w.stride.0, w.stride.1],
                    padding: [w.padding.0, w.padding.1],
                    dilation: [w.dilation.0, w.dilation.1],
                };
                self.apply(Op::Im2col { window }, &[self])
                    .reshape_dims(smallvec![
                        n,
                        Dim::Static(groups),
                        Dim::Static(cg * taps),
                        Dim::Static(oh * ow)
                    ])
            };
            let matrix =
                weight.reshape(&[groups as isize, (o / groups) as isize, (cg * taps) as isize]);
            matrix.matmul(&columns).reshape_dims(smallvec![
                n,
                Dim::Static(o),
                Dim::Static(oh),
                Dim::Static(ow)
            ])
        };
        match bias {
            Some(b) => out + b.reshape(&[o as isize, 1, 1]),
            None => out,
        }
    }

    /// `F.avg_pool2d(x, kernel, stride, padding)` on `[N, C, H, W]` (floor mode,
    /// `count_include_pad=True`: padded zeros count in every window's mean, as PyTorch's
    /// default): the sum of the zero-padded input's strided windows over `kernel²`, one pointwise
    /// kernel. (`avg_pool2d(kernel)` is the stride = kernel, no padding case as a reshape-mean.)
    #[track_caller]
    pub fn avg_pool2d_with(&self, kernel: usize, stride: usize, padding: usize) -> Traced {
        let (padded, w, out) = match self.pool_windows("avg_pool2d", kernel, stride, padding, 0.0) {
            Ok(windows) => windows,
            Err(poisoned) => return poisoned,
        };
        let mut sum: Option<Traced> = None;
        for i in 0..kernel {
            for j in 0..kernel {
                let window = padded.window_at(i, j, w, out);
                sum = Some(match sum {
                    None => window,
                    Some(s) => s + window,
                });
            }
        }
        sum.expect("a kernel has at least one offset") / (kernel * kernel) as f64
    }

    /// The padded input of a `kernel`x`kernel` pooling, its window and the output size, or the
    /// poisoned value of a trace error naming `op` and the sizes.
    #[track_caller]
    fn pool_windows(
        &self,
        op: &str,
        kernel: usize,
        stride: usize,
        padding: usize,
        pad_value: f64,
    ) -> Result<(Traced, Window, (usize, usize)), Traced> {
        if self.rank() != 4 {
            return Err(self.fail_msg(
                op,
                format!("expected [N, C, H, W], found {}", self.describe()),
            ));
        }
        if !self.dtype().is_some_and(|d| d.is_float()) {
            return Err(self.fail_msg(
                op,
                format!("needs a floating-point tensor, found {}", self.describe()),
            ));
        }
        if 2 * padding > kernel {
            return Err(self.fail_msg(
                op,
                format!("padding {padding} must be at most half of the kernel size {kernel}"),
            ));
        }
        let w = Window {
            stride: (stride, stride),
            padding: (padding, padding),
            dilation: (1, 1),
        };
        let out = self.output_size(op, (kernel, kernel), w)?;
        let p = padding as isize;
        let padded = if p > 0 {
            self.pad(&[p, p, p, p], pad_value)
        } else {
            self.clone()
        };
        Ok((padded, w, out))
    }

    /// `F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode)` on `[N, C, H, W]`: the
    /// `maximum` of the `kernel²` dilated, strided windows of the input padded with −inf (on
    /// the right and bottom also as far as a ceil-mode window reaches), so padding never wins.
    #[track_caller]
    pub fn max_pool2d_with(&self, options: PoolOptions) -> Traced {
        let PoolOptions {
            kernel,
            stride,
            padding,
            dilation,
            ..
        } = options;
        let op = "max_pool2d";
        if self.rank() != 4 || !self.dtype().is_some_and(|d| d.is_float()) {
            return self.fail_msg(
                op,
                format!(
                    "expected a floating-point [N, C, H, W], found {}",
                    self.describe()
                ),
            );
        }
        if kernel == 0 || stride == 0 || dilation == 0 || 2 * padding > kernel {
            return self.fail_msg(
                op,
                format!(
                    "kernel {kernel}, stride {stride} and dilation {dilation} must be positive \
                     and padding {padding} at most half of the kernel"
                ),
            );
        }
        let (_, spatial) = self.sizes_after(2);
        let (h, w) = (spatial[0], spatial[1]);
        let (Some(oh), Some(ow)) = (pooled_size(h, options), pooled_size(w, options)) else {
            return self.fail_msg(
                op,
                format!(
                    "a {kernel}x{kernel} window (dilation {dilation}) is larger than the \
                     padded input {}x{} of {}",
                    h + 2 * padding,
                    w + 2 * padding,
                    self.describe()
                ),
            );
        };
        // Past the right padding as far as the last (ceil-mode) window reaches.
        let span = (kernel - 1) * dilation + 1;
        let extra = |size: usize, out: usize| {
            ((out - 1) * stride + span).saturating_sub(size + 2 * padding)
        };
        let (p, eh, ew) = (
            padding as isize,
            extra(h, oh) as isize,
            extra(w, ow) as isize,
        );
        let padded = if p > 0 || eh > 0 || ew > 0 {
            self.pad(&[p, p + ew, p, p + eh], f64::NEG_INFINITY)
        } else {
            self.clone()
        };
        let window = Window {
            stride: (stride, stride),
            padding: (padding, padding),
            dilation: (dilation, dilation),
        };
        let mut out: Option<Traced> = None;
        for i in 0..kernel {
            for j in 0..kernel {
                let taps = padded.window_at(i, j, window, (oh, ow));
                out = Some(match out {
                    None => taps,
                    Some(m) => m.maximum(&taps),
                });
            }
        }
        out.expect("a kernel has at least one offset")
    }

    /// `F.max_pool2d(x, kernel, stride, padding)` on `[N, C, H, W]` (dilation 1, floor mode);
    /// padded positions never win (they are −inf).
    #[track_caller]
    pub fn max_pool2d(&self, kernel: usize, stride: usize, padding: usize) -> Traced {
        let pad = f64::NEG_INFINITY;
        let (padded, w, (oh, ow)) =
            match self.pool_windows("max_pool2d", kernel, stride, padding, pad) {
                Ok(windows) => windows,
                Err(poisoned) => return poisoned,
            };
        let mut out: Option<Traced> = None;
        for i in 0..kernel {
            for j in 0..kernel {
                let window = padded.window_at(i, j, w, (oh, ow));
                out = Some(match out {
                    None => window,
                    Some(m) => m.maximum(&window),
                });
            }
        }
        out.expect("a kernel has at least one offset")
    }
}
