//! `flowrt-fuzz-seedgen REPO OUT`: writes the fuzz targets' seed corpora under `OUT/<target>/`
//! from the repository's own fixtures (`flowrt_fuzz_targets::seeds`, which the stable CI
//! fuzzer also uses). Nothing here is committed; scripts/fuzz runs it before fuzzing.

use std::fs;
use std::path::Path;

use flowrt_fuzz_targets::seeds;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, repo, out] = &args[..] else {
        eprintln!("usage: flowrt-fuzz-seedgen REPO OUT");
        std::process::exit(2);
    };
    let (repo, out) = (Path::new(repo), Path::new(out));
    for (target, seeds) in seeds::generate(repo) {
        let dir = out.join(target);
        fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in &seeds {
            fs::write(dir.join(seeds::file_name(name)), bytes).unwrap();
        }
        println!("{target}: {} seeds", seeds.len());
    }
}
