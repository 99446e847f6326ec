//! Layers, their per-sample gradients and the models built from them, against autograd and PyTorch.
//!
//! One test binary (it links LibTorch once); each module is the tests of one concern.

#[path = "../common/mod.rs"]
mod common;

mod bert_reference;
mod custom_layer;
mod grad_sample;
mod hf_bert;
mod hf_causal_lm;
mod hf_gpt2;
mod hf_llama;
mod layer_arguments;
mod layers_tests;
mod lstm;
mod models;
