//! Writes an rpath to LibTorch's `lib` folder into every binary, test and bench of this crate, so
//! `target/release/dpcomp` runs without `LD_LIBRARY_PATH`. torch-sys (built with
//! `LIBTORCH_USE_PYTORCH=1`) tells us where that folder is through `DEP_TCH_LIBTORCH_LIB`. A crate
//! that depends on dpcomp gets the same folder as `DEP_DPCOMP_LIBTORCH_LIB` (`links = "dpcomp"`)
//! and writes the rpath into its own binaries (tests/dependent-crate/build.rs).
//!
//! It also links `libtorch_cuda.so` with `--no-as-needed` when the wheel has it: otherwise the
//! linker drops the library (no symbol of it is referenced directly) and CUDA is never registered.
//!
//! It compiles `src/grad_hook.cpp` (a callback on a tensor's gradient, `nn::grad_hook`),
//! `src/rng_state.cpp` (the CPU generator's state, `rng_state`), `src/cuda_settings.cpp`
//! (TF32 and cuDNN's benchmark mode, `cuda_settings`), `src/host_copy.cpp` (a copy that does
//! not wait for the device, `comm::staging`), `src/conv_grad.cpp` (a convolution's weight
//! gradient alone, `nn::per_sample`) and `src/avg_pool.cpp` (2x2 average pooling, `nn::pool`)
//! against the wheel's headers, linked to `libtorch_cpu`.
//!
//! With a CUDA build of LibTorch it compiles `src/cuda_memory.cpp` (peak device memory from
//! LibTorch's caching allocator, through c10's headers) and sets `cfg(dpcomp_cuda_memory)`;
//! without one, device memory is reported as unavailable.
//!
//! With the `nccl` feature it compiles `src/nccl.cpp` (a c10d process group on NCCL,
//! `comm::nccl`) and sets `cfg(dpcomp_nccl)` where the headers are present: NCCL's `nccl.h`
//! (the wheel's dependency nvidia-nccl-cu13) and the CUDA runtime's headers (nvidia-cuda-runtime,
//! with nvidia-cuda-crt and nvidia-cuda-cccl, which scripts/setup.sh installs), beside the
//! wheel's `torch` folder, and LibTorch's `libtorch_cuda`. None of them needs a GPU. Where one is
//! missing the build goes on without NCCL and says which (a cargo warning); the binary then
//! reports that this build has no NCCL when a run asks for it.
use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/cuda_memory.cpp");
    println!("cargo:rerun-if-changed=src/grad_hook.cpp");
    println!("cargo:rerun-if-changed=src/rng_state.cpp");
    println!("cargo:rerun-if-changed=src/cuda_settings.cpp");
    println!("cargo:rerun-if-changed=src/host_copy.cpp");
    println!("cargo:rerun-if-changed=src/conv_grad.cpp");
    println!("cargo:rerun-if-changed=src/avg_pool.cpp");
    println!("cargo::rustc-check-cfg=cfg(dpcomp_cuda_memory)");
    println!("cargo::rustc-check-cfg=cfg(dpcomp_nccl)");
    let lib_dir = std::env::var("DEP_TCH_LIBTORCH_LIB").expect(
        "torch-sys did not report LibTorch's lib folder (DEP_TCH_LIBTORCH_LIB): build with scripts/setup.sh's environment",
    );
    let lib_dir = Path::new(&lib_dir);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    // For a dependent crate's build script: `DEP_DPCOMP_LIBTORCH_LIB` (an rpath to write).
    println!("cargo:libtorch_lib={}", lib_dir.display());
    // The wheel's layout: torch/lib beside torch/include.
    let include = lib_dir
        .parent()
        .expect("lib folder has a parent")
        .join("include");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("src/grad_hook.cpp")
        .file("src/rng_state.cpp")
        .file("src/cuda_settings.cpp")
        .file("src/host_copy.cpp")
        .file("src/conv_grad.cpp")
        .file("src/avg_pool.cpp")
        .include(&include)
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .flag_if_supported("-w")
        .compile("dpcomp_grad_hook");
    // The `gloo` feature: a c10d process group on Gloo (`comm::gloo`), against the wheel's
    // c10d headers and Gloo's own from the system (Debian's libgloo-dev).
    println!("cargo:rerun-if-changed=src/gloo.cpp");
    if std::env::var_os("CARGO_FEATURE_GLOO").is_some() {
        if !Path::new("/usr/include/gloo/config.h").exists() {
            panic!(
                "the `gloo` feature needs Gloo's headers in /usr/include/gloo (Debian's libgloo-dev, \
                 which scripts/setup.sh installs); build without the feature otherwise"
            );
        }
        cc::Build::new()
            .cpp(true)
            .std("c++17")
            .file("src/gloo.cpp")
            .include(&include)
            .include(include.join("torch/csrc/api/include"))
            .define("USE_C10D_GLOO", None)
            .define("_GLIBCXX_USE_CXX11_ABI", "1")
            .flag_if_supported("-w")
            .compile("dpcomp_gloo");
    }
    nccl(lib_dir, &include);
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    if !lib_dir.join("libtorch_cuda.so").exists() {
        return;
    }
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch_cuda");
    println!("cargo:rustc-link-arg=-Wl,--as-needed");

    if !include.join("c10/core/CachingDeviceAllocator.h").exists() {
        println!("cargo:warning=LibTorch without c10 headers: peak device memory will be reported as unavailable");
        return;
    }
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("src/cuda_memory.cpp")
        .include(&include)
        .flag_if_supported("-w")
        .compile("dpcomp_cuda_memory");
    println!("cargo:rustc-cfg=dpcomp_cuda_memory");
}

/// The `nccl` feature: `src/nccl.cpp` against the wheel's c10d headers and the NVIDIA packages'
/// headers in the same site-packages folder, linked to libtorch_cuda and libc10_cuda, and
/// `cfg(dpcomp_nccl)`; where something is missing, a warning naming it and no `cfg`.
fn nccl(lib_dir: &Path, include: &Path) {
    println!("cargo:rerun-if-changed=src/nccl.cpp");
    if std::env::var_os("CARGO_FEATURE_NCCL").is_none() {
        return;
    }
    // torch/lib -> site-packages, where pip puts the nvidia-* packages beside torch.
    let site = lib_dir
        .parent()
        .and_then(Path::parent)
        .unwrap_or(lib_dir)
        .join("nvidia");
    let nccl_include = site.join("nccl/include");
    let cuda_include = site.join("cu13/include");
    let needs = [
        (
            lib_dir.join("libtorch_cuda.so"),
            "a CUDA build of LibTorch (torch 2.11.0 from PyPI is one)",
        ),
        (
            nccl_include.join("nccl.h"),
            "nvidia-nccl-cu13 (installed with torch)",
        ),
        (
            cuda_include.join("cuda_runtime_api.h"),
            "nvidia-cuda-runtime (installed with torch)",
        ),
        (
            cuda_include.join("crt/host_config.h"),
            "nvidia-cuda-crt 13.0 (scripts/setup.sh installs it)",
        ),
        (
            cuda_include.join("cccl/cuda/std/version"),
            "nvidia-cuda-cccl 13.0 (scripts/setup.sh installs it)",
        ),
    ];
    if let Some((path, from)) = needs.iter().find(|(path, _)| !path.exists()) {
        println!(
            "cargo:warning=the `nccl` feature is built without NCCL: {} is missing (from {from}); \
             a run that asks for NCCL will say so",
            path.display()
        );
        return;
    }
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("src/nccl.cpp")
        .include(include)
        .include(include.join("torch/csrc/api/include"))
        .include(&nccl_include)
        .include(&cuda_include)
        .include(cuda_include.join("cccl"))
        .define("USE_C10D_NCCL", None)
        .define("USE_CUDA", None)
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .flag_if_supported("-w")
        .compile("dpcomp_nccl");
    println!("cargo:rustc-link-lib=dylib=torch_cuda");
    println!("cargo:rustc-link-lib=dylib=c10_cuda");
    println!("cargo:rustc-cfg=dpcomp_nccl");
}
