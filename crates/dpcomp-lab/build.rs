//! An rpath to LibTorch's lib folder (which dpcomp's build script reports as
//! `DEP_DPCOMP_LIBTORCH_LIB`) in this crate's unit-test binaries, so they run without
//! `LD_LIBRARY_PATH`.
fn main() {
    let lib =
        std::env::var("DEP_DPCOMP_LIBTORCH_LIB").expect("dpcomp reports LibTorch's lib folder");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
}
