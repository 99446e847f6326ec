//! Writes an rpath to LibTorch's `lib` folder into every binary, test and bench of this crate, so
//! `target/release/dpcomp` runs without `LD_LIBRARY_PATH`. torch-sys (built with
//! `LIBTORCH_USE_PYTORCH=1`) tells us where that folder is through `DEP_TCH_LIBTORCH_LIB`.
//!
//! It also links `libtorch_cuda.so` with `--no-as-needed` when the wheel has it: otherwise the
//! linker drops the library (no symbol of it is referenced directly) and CUDA is never registered.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let Ok(lib_dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
    if std::path::Path::new(&lib_dir)
        .join("libtorch_cuda.so")
        .exists()
    {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
