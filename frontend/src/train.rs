//! Training steps: named parameters, a loss, an optimizer, and `step(batch) -> loss` running
//! forward, backward and the update as one compiled program.
//!
//! [`TrainStep::new`] traces one graph whose inputs are the parameters, the optimizer's state
//! (momentum buffers, Adam moments), the per-step scalars (AdamW's bias-corrected step size) and
//! the batch, and whose outputs are the loss, the updated parameters and the updated state:
//! `loss.grad(params)` inside it makes the joint graph, and the update rules are ordinary traced
//! ops, so the optimizer fuses into one pass over each parameter and its state. After each call
//! the outputs replace the parameters and the state (the old blocks are recycled for the next
//! call's outputs by the runtime's block cache), so parameters live in one place and the caller
//! never copies them.
//!
//! The update rules are PyTorch's `torch.optim` single-tensor (`foreach=False`) ones, with its
//! defaults: see [`Sgd`] and [`AdamW`].

use crate::compile::{compile_with, Backend, CompileError, Compiled};
use crate::trace::{TraceError, Traced, Tracer};
use minductor_ir::DType;
use minductor_runtime::{RuntimeError, Tensor};
use std::collections::HashMap;
use std::path::Path;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum TrainError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("the loss must be a floating-point scalar, found {0}")]
    LossNotScalar(String),
    #[error("parameter `{name}`: {message}")]
    Parameter { name: String, message: String },
    #[error("{path}: {message}")]
    Weights { path: String, message: String },
}

/// Named tensors in a fixed order (the order they were inserted, or sorted by name when loaded).
#[derive(Clone, Debug, Default)]
pub struct Parameters {
    names: Vec<String>,
    tensors: Vec<Tensor>,
}

impl Parameters {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `tensor` under `name`, replacing a tensor of that name.
    pub fn insert(&mut self, name: impl Into<String>, tensor: Tensor) {
        let name = name.into();
        match self.names.iter().position(|n| *n == name) {
            Some(i) => self.tensors[i] = tensor,
            None => {
                self.names.push(name);
                self.tensors.push(tensor);
            }
        }
    }

    /// `self` with `tensor` added under `name`.
    pub fn with(mut self, name: impl Into<String>, tensor: Tensor) -> Self {
        self.insert(name, tensor);
        self
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.names
            .iter()
            .position(|n| n == name)
            .map(|i| &self.tensors[i])
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.names.iter().map(String::as_str).zip(&self.tensors)
    }

    /// Every tensor of a safetensors file, sorted by name.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, TrainError> {
        let mut tensors = crate::weights::load_safetensors(path.as_ref())?;
        let mut names: Vec<String> = tensors.keys().cloned().collect();
        names.sort();
        let tensors = names
            .iter()
            .map(|n| tensors.remove(n).expect("listed"))
            .collect();
        Ok(Parameters { names, tensors })
    }

    /// The tensors of a safetensors file named in `names`, in that order; a missing name is an
    /// error naming it.
    pub fn load_only(path: impl AsRef<Path>, names: &[&str]) -> Result<Self, TrainError> {
        let path = path.as_ref();
        let mut tensors = crate::weights::load_safetensors(path)?;
        let mut out = Parameters::new();
        for &name in names {
            let t = tensors.remove(name).ok_or_else(|| TrainError::Weights {
                path: path.display().to_string(),
                message: format!("no tensor named `{name}`"),
            })?;
            out.insert(name, t);
        }
        Ok(out)
    }
}

/// `torch.optim.SGD`: `g += weight_decay·p; buf = momentum·buf + (1 − dampening)·g` (the first
/// step takes `buf = g`); `g = g + momentum·buf` with Nesterov, else `g = buf`; `p −= lr·g`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sgd {
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
}

impl Sgd {
    /// Plain SGD with learning rate `lr` (PyTorch's defaults: no momentum, no weight decay).
    pub fn new(lr: f64) -> Self {
        Sgd {
            lr,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }
    }
    pub fn momentum(self, momentum: f64) -> Self {
        Sgd { momentum, ..self }
    }
    pub fn dampening(self, dampening: f64) -> Self {
        Sgd { dampening, ..self }
    }
    pub fn weight_decay(self, weight_decay: f64) -> Self {
        Sgd {
            weight_decay,
            ..self
        }
    }
    pub fn nesterov(self) -> Self {
        Sgd {
            nesterov: true,
            ..self
        }
    }
}

/// `torch.optim.AdamW`: `p *= 1 − lr·weight_decay; m = lerp(m, g, 1 − β1); v = β2·v + (1 − β2)·g²;
/// p −= lr/(1 − β1^t) · m / (√v / √(1 − β2^t) + eps)`. Defaults: lr 1e-3, betas (0.9, 0.999),
/// eps 1e-8, weight_decay 1e-2 (amsgrad is not supported).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
        }
    }
}

impl AdamW {
    pub fn new(lr: f64) -> Self {
        AdamW {
            lr,
            ..Self::default()
        }
    }
    pub fn betas(self, beta1: f64, beta2: f64) -> Self {
        AdamW {
            betas: (beta1, beta2),
            ..self
        }
    }
    pub fn eps(self, eps: f64) -> Self {
        AdamW { eps, ..self }
    }
    pub fn weight_decay(self, weight_decay: f64) -> Self {
        AdamW {
            weight_decay,
            ..self
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    Sgd(Sgd),
    AdamW(AdamW),
}

impl From<Sgd> for Optimizer {
    fn from(o: Sgd) -> Self {
        Optimizer::Sgd(o)
    }
}

impl From<AdamW> for Optimizer {
    fn from(o: AdamW) -> Self {
        Optimizer::AdamW(o)
    }
}

impl Optimizer {
    /// State tensors kept per parameter (momentum buffer; Adam's two moments).
    fn state_per_parameter(&self) -> usize {
        match self {
            Optimizer::Sgd(s) if s.momentum != 0.0 => 1,
            Optimizer::Sgd(_) => 0,
            Optimizer::AdamW(_) => 2,
        }
    }

    /// Names and values of the 0-d per-step inputs for step `t` (1-based).
    fn step_scalars(&self, t: u64) -> Vec<(&'static str, f32)> {
        match self {
            Optimizer::Sgd(_) => Vec::new(),
            Optimizer::AdamW(a) => {
                // As PyTorch computes them: in double precision on the host.
                let step_size = a.lr / (1.0 - a.betas.0.powf(t as f64));
                let correction2_sqrt = (1.0 - a.betas.1.powf(t as f64)).sqrt();
                vec![
                    ("adamw_step_size", step_size as f32),
                    ("adamw_correction2_sqrt", correction2_sqrt as f32),
                ]
            }
        }
    }

    /// The updated parameter and state, traced.
    fn update(
        &self,
        p: &Traced,
        g: &Traced,
        state: &[Traced],
        scalars: &[Traced],
    ) -> (Traced, Vec<Traced>) {
        match self {
            Optimizer::Sgd(s) => {
                let mut g = g.clone();
                if s.weight_decay != 0.0 {
                    g = &g + p * s.weight_decay;
                }
                let mut new_state = Vec::new();
                if s.momentum != 0.0 {
                    // The buffer starts at zero, so the first step gives exactly `g` when
                    // dampening is 0, as PyTorch's first-step copy does.
                    let buf = &state[0] * s.momentum + &g * (1.0 - s.dampening);
                    g = if s.nesterov {
                        &g + &buf * s.momentum
                    } else {
                        buf.clone()
                    };
                    new_state.push(buf);
                }
                (p + g * (-s.lr), new_state)
            }
            Optimizer::AdamW(a) => {
                let (beta1, beta2) = a.betas;
                let decayed = p * (1.0 - a.lr * a.weight_decay);
                // lerp(m, g, w) = m + w·(g − m) for w < 0.5, else g − (g − m)·(1 − w).
                let w = 1.0 - beta1;
                let m = if w < 0.5 {
                    &state[0] + (g - &state[0]) * w
                } else {
                    g - (g - &state[0]) * (1.0 - w)
                };
                let v = &state[1] * beta2 + g * g * (1.0 - beta2);
                let denom = v.sqrt() / &scalars[1] + a.eps;
                let updated = decayed - &m / denom * &scalars[0];
                (updated, vec![m, v])
            }
        }
    }
}

/// A compiled training step: forward, backward and the optimizer update in one program.
pub struct TrainStep {
    compiled: Compiled,
    optimizer: Optimizer,
    params: Parameters,
    state: Vec<Tensor>,
    steps: u64,
    batch_arity: usize,
}

/// The traced parameters, by name, handed to the loss function.
pub type TracedParameters = HashMap<String, Traced>;

impl TrainStep {
    /// Traces `loss(params, batch)` for a batch of the given names, dtypes and shapes, and
    /// compiles the step with the inductor backend.
    pub fn new(
        params: Parameters,
        optimizer: impl Into<Optimizer>,
        batch: &[(&str, DType, &[usize])],
        loss: impl FnOnce(&TracedParameters, &[Traced]) -> Traced,
    ) -> Result<TrainStep, TrainError> {
        Self::with_backend(Backend::Inductor, params, optimizer, batch, loss)
    }

    /// Like [`TrainStep::new`] on the named backend.
    pub fn with_backend(
        backend: Backend,
        params: Parameters,
        optimizer: impl Into<Optimizer>,
        batch: &[(&str, DType, &[usize])],
        loss: impl FnOnce(&TracedParameters, &[Traced]) -> Traced,
    ) -> Result<TrainStep, TrainError> {
        let optimizer = optimizer.into();
        for (name, t) in params.iter() {
            if !t.dtype().is_float() {
                return Err(TrainError::Parameter {
                    name: name.to_string(),
                    message: format!("parameters must be floating-point, found {}", t.dtype()),
                });
            }
        }
        let tracer = Tracer::new();
        let traced: Vec<Traced> = params
            .iter()
            .map(|(name, t)| tracer.input(name, t.dtype(), t.shape()))
            .collect();
        let per = optimizer.state_per_parameter();
        let mut state = Vec::new();
        let mut traced_state = Vec::new();
        for (name, t) in params.iter() {
            for k in 0..per {
                state.push(Tensor::zeros(t.dtype(), t.shape()));
                traced_state.push(tracer.input(&format!("{name}.state{k}"), t.dtype(), t.shape()));
            }
        }
        let scalars: Vec<Traced> = optimizer
            .step_scalars(1)
            .iter()
            .map(|(name, _)| tracer.input(name, DType::F32, &[]))
            .collect();
        let batch_inputs: Vec<Traced> = batch
            .iter()
            .map(|(name, dtype, shape)| tracer.input(name, *dtype, shape))
            .collect();
        let by_name: TracedParameters = params
            .names()
            .iter()
            .cloned()
            .zip(traced.iter().cloned())
            .collect();
        let loss = loss(&by_name, &batch_inputs);
        if let Some(ty) = loss.ty() {
            if ty.rank() != 0 || !ty.dtype.is_float() {
                return Err(TrainError::LossNotScalar(ty.to_string()));
            }
        }
        let wrt: Vec<&Traced> = traced.iter().collect();
        let grads = loss.grad(&wrt);
        let mut outputs = vec![loss.clone()];
        let mut new_state = Vec::new();
        for (i, (p, g)) in traced.iter().zip(&grads).enumerate() {
            let (updated, s) =
                optimizer.update(p, g, &traced_state[i * per..(i + 1) * per], &scalars);
            outputs.push(updated.cast(p.dtype().unwrap_or(DType::F32)));
            new_state.extend(s);
        }
        outputs.extend(new_state);
        drop(by_name);
        let graph = tracer.finish(&outputs)?;
        let compiled = compile_with(&graph, backend)?;
        Ok(TrainStep {
            compiled,
            optimizer,
            params,
            state,
            steps: 0,
            batch_arity: batch.len(),
        })
    }

    /// Runs one step on `batch`: returns the loss before the update and updates the parameters
    /// and the optimizer state.
    pub fn step(&mut self, batch: &[Tensor]) -> Result<f32, TrainError> {
        if batch.len() != self.batch_arity {
            return Err(RuntimeError::Arity {
                expected: self.batch_arity,
                found: batch.len(),
            }
            .into());
        }
        let t = self.steps + 1;
        let mut inputs: Vec<Tensor> = self.params.tensors.clone();
        inputs.extend(self.state.iter().cloned());
        inputs.extend(
            self.optimizer
                .step_scalars(t)
                .into_iter()
                .map(|(_, v)| Tensor::scalar(v)),
        );
        inputs.extend(batch.iter().cloned());
        let mut outputs = self.compiled.call(&inputs)?.into_iter();
        drop(inputs);
        let loss = outputs.next().expect("the loss is the first output");
        for p in self.params.tensors.iter_mut() {
            *p = outputs.next().expect("one updated value per parameter");
        }
        for s in self.state.iter_mut() {
            *s = outputs.next().expect("one updated value per state tensor");
        }
        self.steps = t;
        Ok(loss.to_f64_vec()[0] as f32)
    }

    pub fn parameters(&self) -> &Parameters {
        &self.params
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The compiled program (its graph, artifacts and profile).
    pub fn compiled(&self) -> &Compiled {
        &self.compiled
    }
}
