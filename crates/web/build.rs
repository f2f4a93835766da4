//! Finds the front-end libraries installed by `npm ci --prefix ui` (run by
//! scripts/setup.sh) so that the web UI's assets are embedded in the binary.
fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ui/node_modules");
    let dagre = root.join("@dagrejs/dagre/dist/dagre.min.js");
    println!("cargo:rerun-if-changed={}", dagre.display());
    if !dagre.is_file() {
        panic!(
            "the web UI's graph layout library is missing ({}): run `npm ci --prefix ui` in the checkout (scripts/setup.sh does)",
            dagre.display()
        );
    }
    println!("cargo:rustc-env=WEIR_DAGRE_JS={}", dagre.canonicalize().unwrap().display());
}
