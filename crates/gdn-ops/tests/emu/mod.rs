//! Shared by the Metal emulation tests: compiling a harness from `kernels/emu/` with clang-19
//! and running it on one case (binary input on stdin, f32 results on stdout).
#![allow(dead_code)] // each test uses its part: the ABI helpers are for the kernel tests only

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// Compiles `kernels/emu/<name>.cpp` (which includes a shipped `.metal` file) into the test's
/// temporary folder. Panics, never skips, when clang-19 or compiler-rt is missing.
pub fn compile_harness(name: &str, extra_flags: &[&str]) -> PathBuf {
    let emu = workspace_root().join("kernels/emu");
    // One binary per set of flags: a harness may be built twice with other -D flags.
    let variant: String = extra_flags
        .iter()
        .filter(|f| f.starts_with("-D"))
        .flat_map(|f| f.chars().filter(char::is_ascii_alphanumeric))
        .collect();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}{variant}-{}", std::process::id()));
    let cxx = std::env::var("GDN_EMU_CXX").unwrap_or_else(|_| "clang++-19".into());
    let started = Instant::now();
    let result = Command::new(&cxx)
        .args([
            "-std=c++17",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "--rtlib=compiler-rt",
        ])
        .args(extra_flags)
        .arg("-I")
        .arg(&emu)
        .arg(emu.join(format!("{name}.cpp")))
        .arg("-o")
        .arg(&out)
        .output();
    let output = match result {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "{name}: `{cxx}` not found. The emulation tests need clang 19 with compiler-rt: \
             `apt-get install clang-19 libclang-rt-19-dev` (Debian bookworm), or set GDN_EMU_CXX"
        ),
        Err(e) => panic!("{name}: cannot run `{cxx}`: {e}"),
    };
    assert!(
        output.status.success(),
        "{name}: compiling through kernels/emu failed (is libclang-rt-19-dev installed? \
         --rtlib=compiler-rt needs it):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("{name} compiled in {:.1}s", started.elapsed().as_secs_f32());
    out
}

/// A harness of `kernels/emu/`, compiled on first use, once per test binary.
pub struct Harness {
    name: &'static str,
    flags: &'static [&'static str],
    /// Whether it also needs the CUDA stand-ins of `kernels/emu/cuda/`.
    cuda: bool,
    path: OnceLock<PathBuf>,
}

impl Harness {
    /// `kernels/emu/<name>.cpp`, a shipped `.metal` kernel on the Metal emulation.
    pub const fn metal(name: &'static str) -> Self {
        Self::metal_with(name, &[])
    }
    /// As [`Harness::metal`], compiled with extra clang flags.
    pub const fn metal_with(name: &'static str, flags: &'static [&'static str]) -> Self {
        Self {
            name,
            flags,
            cuda: false,
            path: OnceLock::new(),
        }
    }
    /// `kernels/emu/<name>.cpp`, a shipped `.cu` kernel body on the Metal emulation plus the
    /// CUDA stand-ins.
    pub const fn cuda(name: &'static str) -> Self {
        Self::cuda_with(name, &[])
    }
    /// As [`Harness::cuda`], compiled with extra clang flags.
    pub const fn cuda_with(name: &'static str, flags: &'static [&'static str]) -> Self {
        Self {
            name,
            flags,
            cuda: true,
            path: OnceLock::new(),
        }
    }
    /// The compiled binary (compiling it on the first call).
    pub fn path(&self) -> &Path {
        self.path.get_or_init(|| {
            let stand_ins = workspace_root().join("kernels/emu/cuda");
            let stand_ins = stand_ins.to_str().expect("a UTF-8 path");
            let mut flags = self.flags.to_vec();
            if self.cuda {
                flags.extend(["-I", stand_ins]);
            }
            compile_harness(self.name, &flags)
        })
    }
    /// Runs the harness on one case ([`run_harness`]).
    pub fn run(&self, input: &[u8]) -> Result<Vec<f32>, String> {
        run_harness(self.path(), input)
    }
}

/// Runs a compiled harness on one case and returns the f32 values it printed.
pub fn run_harness(harness: &Path, input: &[u8]) -> Result<Vec<f32>, String> {
    let mut child = Command::new(harness)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the harness: {e}"))?;
    // The harness reads all of its input before writing anything.
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input)
        .map_err(|e| format!("writing the case: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("harness: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "harness failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    if out.stdout.len() % 4 != 0 {
        return Err(format!(
            "harness printed {} bytes, not f32s",
            out.stdout.len()
        ));
    }
    Ok(out
        .stdout
        .chunks_exact(4)
        .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect())
}

/// A harness's output cut into arrays of `lens` values, in order; an error when it wrote
/// another count.
pub fn split_output<const N: usize>(
    floats: Vec<f32>,
    lens: [usize; N],
) -> Result<[Vec<f32>; N], String> {
    let want: usize = lens.iter().sum();
    if floats.len() != want {
        return Err(format!(
            "harness wrote {} floats, expected {want}",
            floats.len()
        ));
    }
    let mut rest = floats.as_slice();
    Ok(lens.map(|n| {
        let (head, tail) = rest.split_at(n);
        rest = tail;
        head.to_vec()
    }))
}

/// The fields of `struct <name>` in `kernels/params/<header>`, as `(type, field)` in order:
/// what an ABI test compares with the `#[repr(C)]` mirror on the Rust side.
pub fn params_fields(header: &str, name: &str) -> Vec<(String, String)> {
    let path = workspace_root().join("kernels/params").join(header);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let start = code
        .find(&format!("struct {name} {{"))
        .unwrap_or_else(|| panic!("{}: no struct {name}", path.display()));
    let body = &code[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
    body.split(';')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(|f| {
            let words: Vec<&str> = f.split_whitespace().collect();
            let (field, ty) = words.split_last().expect("a field");
            (ty.join(" "), field.to_string())
        })
        .collect()
}

/// Asserts that `struct <name>` of `kernels/params/<header>` declares `fields` in order, each
/// `unsigned int` but those written `"float <field>"`: what the host's `#[repr(C)]` mirror
/// must match.
pub fn assert_params(header: &str, name: &str, fields: &[&str]) {
    let want: Vec<(String, String)> = fields
        .iter()
        .map(|f| match f.strip_prefix("float ") {
            Some(field) => ("float".to_string(), field.to_string()),
            None => ("unsigned int".to_string(), f.to_string()),
        })
        .collect();
    assert_eq!(
        params_fields(header, name),
        want,
        "{name} (kernels/params/{header}) must match the host's #[repr(C)] mirror"
    );
}

/// Asserts that a flattened source ([`flatten_source`]) has `line` inside an
/// `#if defined(__HAVE_BFLOAT__)` block, as a bfloat instantiation must be (macOS 13 has no
/// bfloat).
pub fn assert_bfloat_guarded(flat: &str, line: &str) {
    let guarded = flat
        .split("#if defined(__HAVE_BFLOAT__)")
        .skip(1)
        .any(|after| after.split("#endif").next().unwrap().contains(line));
    assert!(
        guarded,
        "`{line}` must sit inside #if defined(__HAVE_BFLOAT__)"
    );
}

/// A source file without `//` comments, whitespace squashed to single spaces: what the ABI
/// tests search.
pub fn flatten_source(src: &str) -> String {
    let code: String = src
        .lines()
        .map(|l| l.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    code.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A shipped source (`path` from the workspace root), flattened ([`flatten_source`]).
pub fn shipped_source(path: &str) -> String {
    flatten_source(&std::fs::read_to_string(workspace_root().join(path)).unwrap())
}

/// A shipped source ([`shipped_source`]) that must include `kernels/params/<header>`, the
/// parameter struct the host mirrors (outside any `/* */` comment).
pub fn shipped_source_including(path: &str, header: &str) -> String {
    let src = shipped_source(path);
    assert!(
        strip_block_comments(&src).contains(&format!("#include \"params/{header}\"")),
        "{path} must include params/{header}"
    );
    src
}

/// A flattened source ([`flatten_source`]) without its `/* */` comments, squashed again.
pub fn strip_block_comments(flat: &str) -> String {
    let mut flat = flat.to_string();
    while let Some(start) = flat.find("/*") {
        let end = flat[start..].find("*/").unwrap() + start + 2;
        flat.replace_range(start..end, "");
    }
    flat.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Asserts that `src` binds each of `buffers` at its index (` <name> [[buffer(<i>)]]`),
/// `what` naming the kernel in the message.
pub fn assert_buffer_indices(src: &str, what: &str, buffers: &[&str], prefix: &str) {
    for (i, name) in buffers.iter().enumerate() {
        assert!(
            src.contains(&format!("{prefix}{name} [[buffer({i})]]")),
            "{what}: {name} must be buffer {i}"
        );
    }
}

/// Asserts that `src` instantiates `kernel` for every activation type
/// (`(<kernel>_<t>, ...)`).
pub fn assert_instantiated(src: &str, kernel: &str) {
    for t in ["f32", "f16", "bf16"] {
        assert!(
            src.contains(&format!("({kernel}_{t},")),
            "missing {kernel}_{t}"
        );
    }
}

/// Asserts that the kernel defined from `start` on binds exactly `buffers` at indices 0.., in
/// order, in a flattened source ([`flatten_source`]).
pub fn assert_buffers(flat: &str, start: &str, buffers: &[&str]) {
    let mut from = flat
        .find(start)
        .unwrap_or_else(|| panic!("`{start}` missing"));
    for (i, name) in buffers.iter().enumerate() {
        let needle = format!("{name} [[buffer({i})]]");
        let at = flat[from..]
            .find(&needle)
            .unwrap_or_else(|| panic!("{start}: `{needle}` missing or out of order"));
        from += at + needle.len();
    }
    let body_end = flat[from..].find('{').map_or(flat.len(), |e| from + e);
    assert!(
        !flat[from..body_end].contains("[[buffer("),
        "{start}: more buffers than the host binds"
    );
}
