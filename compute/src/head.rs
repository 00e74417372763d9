//! The trained part of the network, layers [freeze, end), and its optimiser.
//!
//! The package's layers [freeze, end - 1) are loaded as trainable TorchScript modules with
//! their pre-trained weights; the last layer (the classifier) is replaced by a new linear layer
//! sized to the data set's classes. The optimiser is written out here, not taken from tch, so
//! that its state (momentum, Adam moments, step count) goes into the checkpoint and a resumed
//! job continues exactly where it stopped.

use anyhow::{Context, bail};
use hapi_model::ModelPackage;
use std::collections::BTreeMap;
use std::path::Path;
use tch::nn::{self, Module, ModuleT};
use tch::{Device, Kind, Tensor};

/// Which optimiser, with its hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum OptimizerKind {
    Sgd {
        momentum: f64,
        weight_decay: f64,
    },
    Adam {
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
}

/// The new head and everything trained.
#[derive(Debug)]
pub struct Head {
    vs: nn::VarStore,
    body: Vec<tch::TrainableCModule>,
    classifier: nn::Linear,
    opt: OptimizerKind,
    lr: f64,
    /// Optimiser state by name (`<var>.m`, `<var>.v`, `<var>.buf`).
    state: BTreeMap<String, Tensor>,
    step: i64,
}

impl Head {
    /// Layers [freeze, end - 1) of `pkg` plus a new classifier with `classes` outputs, on
    /// `device`, initialised from `seed`.
    pub fn new(
        pkg: &ModelPackage,
        freeze: usize,
        classes: usize,
        device: Device,
        seed: u64,
        opt: OptimizerKind,
        lr: f64,
    ) -> anyhow::Result<Self> {
        let m = pkg.manifest();
        let n = m.layers.len();
        if freeze >= n {
            bail!(
                "freeze index {freeze} leaves no layer to train in `{}` ({n} layers)",
                m.name
            );
        }
        let last = &m.layers[n - 1];
        let [features] = last.input_shape[..] else {
            bail!(
                "`{}`: the last layer `{}` takes {:?}, not flat features; cannot replace it with a classifier",
                m.name,
                last.name,
                last.input_shape
            );
        };
        tch::manual_seed(seed as i64);
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let mut body = Vec::new();
        for (i, layer) in m.layers.iter().enumerate().take(n - 1).skip(freeze) {
            let path = pkg.dir().join(&layer.file);
            let mut module = tch::TrainableCModule::load(&path, &root / format!("layer{i}"))
                .with_context(|| format!("loading layer {i} (`{}`) as trainable", layer.name))?;
            module.set_train();
            body.push(module);
        }
        let classifier = nn::linear(
            &root / "classifier",
            features,
            classes as i64,
            Default::default(),
        );
        Ok(Self {
            vs,
            body,
            classifier,
            opt,
            lr,
            state: BTreeMap::new(),
            step: 0,
        })
    }

    pub fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        let mut x = x.shallow_clone();
        for m in &self.body {
            x = m.forward_t(&x, train);
        }
        self.classifier.forward(&x)
    }

    /// One optimiser step on the batch; returns the loss.
    pub fn train_step(&mut self, x: &Tensor, labels: &Tensor) -> f64 {
        for v in self.vs.trainable_variables() {
            let mut g = v.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        let logits = self.forward(x, true);
        let loss = logits.cross_entropy_for_logits(labels);
        loss.backward();
        self.apply();
        loss.double_value(&[])
    }

    /// Number of correct predictions.
    pub fn correct(&self, x: &Tensor, labels: &Tensor) -> i64 {
        tch::no_grad(|| {
            let pred = self.forward(x, false).argmax(-1, false);
            pred.eq_tensor(labels)
                .to_kind(Kind::Int64)
                .sum(Kind::Int64)
                .int64_value(&[])
        })
    }

    fn apply(&mut self) {
        self.step += 1;
        let t = self.step as f64;
        let vars = self.vs.variables();
        tch::no_grad(|| {
            for (name, mut v) in vars {
                let g = v.grad();
                if !g.defined() {
                    continue;
                }
                match self.opt {
                    OptimizerKind::Sgd {
                        momentum,
                        weight_decay,
                    } => {
                        let g = if weight_decay > 0.0 {
                            &g + &v * weight_decay
                        } else {
                            g
                        };
                        let update = if momentum > 0.0 {
                            let key = format!("{name}.buf");
                            let buf = match self.state.remove(&key) {
                                Some(b) => b * momentum + &g,
                                None => g.copy(),
                            };
                            let u = buf.shallow_clone();
                            self.state.insert(key, buf);
                            u
                        } else {
                            g
                        };
                        let _ = v.f_sub_(&(update * self.lr));
                    }
                    OptimizerKind::Adam {
                        beta1,
                        beta2,
                        eps,
                        weight_decay,
                    } => {
                        let g = if weight_decay > 0.0 {
                            &g + &v * weight_decay
                        } else {
                            g
                        };
                        let mk = format!("{name}.m");
                        let vk = format!("{name}.v");
                        let m = match self.state.remove(&mk) {
                            Some(m) => m * beta1 + &g * (1.0 - beta1),
                            None => &g * (1.0 - beta1),
                        };
                        let sq = match self.state.remove(&vk) {
                            Some(s) => s * beta2 + &g * &g * (1.0 - beta2),
                            None => &g * &g * (1.0 - beta2),
                        };
                        let mhat = &m / (1.0 - beta1.powf(t));
                        let vhat = &sq / (1.0 - beta2.powf(t));
                        let _ = v.f_sub_(&(mhat / (vhat.sqrt() + eps) * self.lr));
                        self.state.insert(mk, m);
                        self.state.insert(vk, sq);
                    }
                }
            }
        });
    }

    /// Writes weights and optimiser state into `dir` (which must exist).
    pub fn save(&self, dir: &Path) -> anyhow::Result<()> {
        self.vs
            .save(dir.join("head.safetensors"))
            .context("saving the head's weights")?;
        let mut named: Vec<(String, Tensor)> = self
            .state
            .iter()
            .map(|(k, v)| (k.clone(), v.shallow_clone()))
            .collect();
        named.push(("__step".into(), Tensor::from(self.step)));
        Tensor::write_safetensors(&named, dir.join("optimizer.safetensors"))
            .context("saving the optimiser state")?;
        Ok(())
    }

    /// Restores what [`Head::save`] wrote.
    pub fn load(&mut self, dir: &Path) -> anyhow::Result<()> {
        self.vs
            .load(dir.join("head.safetensors"))
            .with_context(|| format!("loading the head's weights from {}", dir.display()))?;
        let device = self.vs.device();
        self.state.clear();
        for (k, v) in Tensor::read_safetensors(dir.join("optimizer.safetensors"))
            .with_context(|| format!("loading the optimiser state from {}", dir.display()))?
        {
            if k == "__step" {
                self.step = v.int64_value(&[]);
            } else {
                self.state.insert(k, v.to_device(device));
            }
        }
        Ok(())
    }

    /// Trainable parameters.
    pub fn num_params(&self) -> i64 {
        self.vs
            .trainable_variables()
            .iter()
            .map(Tensor::numel)
            .map(|n| n as i64)
            .sum()
    }
}
