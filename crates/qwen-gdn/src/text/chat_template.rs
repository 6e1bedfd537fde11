//! Chat templates rendered with minijinja the way transformers renders them with jinja2, byte for
//! byte: trim_blocks + lstrip_blocks, Python's `str()` when printing values, `tojson` as
//! `json.dumps(ensure_ascii=False)`, `raise_exception`, `strftime_now`, and the Python string /
//! dict methods (minijinja-contrib's pycompat).

mod budget;
mod guards;
mod rewrite;

use anyhow::{bail, Context, Result};
use minijinja::machinery::{self, Vm};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::{Map, Value as Json};
use std::path::Path;

/// Instructions a template may run per rendering: every reference rendering of
/// tests/data/chat-templates needs fewer than 1 000, a `range(100000)` loop nested twice
/// would need ten billion.
pub const DEFAULT_FUEL: u64 = 10_000_000;
/// Overrides [`DEFAULT_FUEL`].
pub const FUEL_ENV: &str = "QWEN_GDN_TEMPLATE_FUEL";
/// Output bytes a template may write unless [`ChatTemplate::limit_output`] says otherwise.
pub const DEFAULT_MAX_OUTPUT: usize = 64 << 20;
/// Bytes of strings and lists a rendering may build in all (printed text, captures,
/// concatenations, filter results): 64 MiB, plus [`BYTES_PER_INPUT_BYTE`] per byte of its
/// messages, tools and variables.
pub const DEFAULT_BYTES: usize = 64 << 20;
/// A real template copies its input several times (trimmed, split, through a macro, each
/// `+` of a chain copying the text so far): the Qwen templates of tests/data/chat-templates
/// build up to 6.4 bytes per byte of a conversation of long messages.
pub const BYTES_PER_INPUT_BYTE: usize = 16;
/// The largest chat_template.jinja read, as for the other side files of a checkpoint.
const MAX_SOURCE_BYTES: u64 = 64 << 20;
/// Overrides the byte budget.
pub const BYTES_ENV: &str = "QWEN_GDN_TEMPLATE_BYTES";

/// Variables the caller fills in; `--chat-template-args` must not replace them (the prompt
/// would be silently dropped).
pub const RESERVED_VARIABLES: [&str; 4] =
    ["messages", "tools", "documents", "add_generation_prompt"];

/// A rendering stopped by a limit (bytes, nesting, instructions): the template's fault, not
/// its input's (the budget grows with the input), so `serve` answers it with a 500.
#[derive(Debug)]
pub struct TemplateLimit(String);

impl std::fmt::Display for TemplateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TemplateLimit {}

pub struct ChatTemplate {
    env: Environment<'static>,
    name: String,
    fuel: u64,
    max_output: usize,
    /// [`BYTES_ENV`], when set.
    max_bytes: Option<usize>,
}

impl ChatTemplate {
    /// The model's template: `chat_template.jinja`, else `chat_template` of tokenizer_config.json
    /// (a string, or a list of `{name, template}` of which "default" is used). `None` when the
    /// model has none.
    pub fn from_dir(dir: &Path, tokenizer_config: Option<&Json>) -> Result<Option<Self>> {
        let file = dir.join("chat_template.jinja");
        // Not opened before it is known to be a file: opening a FIFO would block.
        match std::fs::metadata(&file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read {}", file.display()));
            }
            Ok(m) if !m.is_file() => bail!(
                "{} is not a regular file (a folder, a FIFO or a device); the chat template \
                 must be a file",
                file.display()
            ),
            Ok(m) if m.len() > MAX_SOURCE_BYTES => bail!(
                "{}: {} bytes, larger than a chat template may be ({MAX_SOURCE_BYTES})",
                file.display(),
                m.len()
            ),
            Ok(_) => {
                let source = std::fs::read_to_string(&file)
                    .with_context(|| format!("cannot read {}", file.display()))?;
                return Self::new(file.display().to_string(), source).map(Some);
            }
        }
        let name = dir.join("tokenizer_config.json").display().to_string();
        let source = match tokenizer_config.and_then(|c| c.get("chat_template")) {
            None | Some(Json::Null) => return Ok(None),
            Some(Json::String(s)) => s.clone(),
            Some(Json::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                .and_then(|t| t.get("template")?.as_str())
                .with_context(|| format!("{name}: chat_template lists no \"default\" template"))?
                .to_string(),
            Some(_) => bail!("{name}: chat_template is neither a string nor a list of templates"),
        };
        Self::new(format!("{name} (chat_template)"), source).map(Some)
    }

    /// `name` (the file it came from) labels errors.
    pub fn new(name: String, source: String) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // Debug info would put the template source into the (one-line) error message.
        env.set_debug(false);
        // Bounded filters and methods, and the guards of the rewritten code (see render).
        guards::register(&mut env);
        // Every byte printed, into the output or into a capture, is counted first.
        env.set_formatter(|out, _state, value| {
            let text = match value.as_str() {
                Some(s) if value.kind() == ValueKind::String => std::borrow::Cow::Borrowed(s),
                _ => std::borrow::Cow::Owned(py_str(value)?),
            };
            budget::charge(text.len())?;
            out.write_str(&text).map_err(Error::from)
        });
        env.add_filter("tojson", tojson);
        env.add_filter("string", |v: Value| -> Result<String, Error> {
            let s = py_str(&v)?;
            budget::charge(s.len())?;
            Ok(s)
        });
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", source)
            .with_context(|| format!("cannot parse chat template {name}"))?;
        let fuel = match std::env::var(FUEL_ENV) {
            Err(_) => DEFAULT_FUEL,
            Ok(v) => v
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .with_context(|| format!("{FUEL_ENV}={v:?}: expected a positive integer"))?,
        };
        env.set_fuel(Some(fuel));
        let max_bytes = match std::env::var(BYTES_ENV) {
            Err(_) => None,
            Ok(v) => Some(
                v.parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .with_context(|| format!("{BYTES_ENV}={v:?}: expected a positive integer"))?,
            ),
        };
        Ok(Self {
            env,
            name,
            fuel,
            max_output: DEFAULT_MAX_OUTPUT,
            max_bytes,
        })
    }

    /// The template's Jinja source (e.g. to tell which tool-call format it teaches).
    pub fn source(&self) -> String {
        self.env
            .get_template("chat")
            .map_or_else(|_| String::new(), |t| t.source().to_string())
    }

    /// Caps the rendered text at `bytes` (the caller knows how much its context can hold).
    pub fn limit_output(mut self, bytes: usize) -> Self {
        self.max_output = bytes;
        self
    }

    /// Renders `messages` as transformers' `apply_chat_template(tokenize=False)` does; `extra`
    /// holds the other template variables (special tokens, `enable_thinking`, ...).
    pub fn render(
        &self,
        messages: &[Json],
        tools: Option<&Json>,
        add_generation_prompt: bool,
        extra: &Map<String, Json>,
    ) -> Result<String> {
        let mut ctx = Map::new();
        ctx.insert(
            "messages".into(),
            messages.iter().map(alias_reasoning).collect(),
        );
        ctx.insert("tools".into(), tools.cloned().unwrap_or(Json::Null));
        ctx.insert("documents".into(), Json::Null);
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        if let Some(key) = RESERVED_VARIABLES.iter().find(|k| extra.contains_key(**k)) {
            bail!(
                "chat template {}: variable `{key}` cannot be overridden",
                self.name
            );
        }
        ctx.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        let template = self.env.get_template("chat")?;
        // The compiled code with a budget check before each instruction that can build a
        // large value by itself; minijinja's Template::render runs the same VM on the original.
        let compiled = machinery::get_compiled_template(&template);
        let code = rewrite::guarded(&compiled.instructions);
        let blocks = compiled
            .blocks
            .iter()
            .map(|(name, block)| (*name, rewrite::guarded(block)))
            .collect();
        let input = json_bytes(&ctx["messages"])
            .saturating_add(json_bytes(&ctx["tools"]))
            .saturating_add(extra.values().map(json_bytes).sum());
        let max_bytes = self.max_bytes.unwrap_or_else(|| {
            BYTES_PER_INPUT_BYTE
                .saturating_mul(input)
                .saturating_add(DEFAULT_BYTES)
        });
        let mut text = String::new();
        let rendering = budget::Rendering::start(max_bytes);
        let result = Vm::new(&self.env).eval(
            &code,
            Value::from_serialize(&ctx),
            &blocks,
            &mut machinery::make_string_output(&mut text),
            compiled.initial_auto_escape,
        );
        match result {
            Ok(_) if text.len() > self.max_output => bail!(
                "chat template {}: the rendered prompt is larger than {} bytes",
                self.name,
                self.max_output
            ),
            Ok(_) => Ok(text),
            Err(_) if rendering.exceeded() => Err(TemplateLimit(format!(
                "chat template {}: building the prompt takes more than {max_bytes} bytes of text and lists; {BYTES_ENV} raises the limit",
                self.name,
            )).into()),
            Err(_) if rendering.too_deep() => Err(TemplateLimit(format!(
                "chat template {}: builds lists, maps or namespaces nested more than {} deep (or a namespace that holds itself)",
                self.name,
                budget::MAX_NESTING
            )).into()),
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(TemplateLimit(format!(
                "chat template {}: ran more than {} instructions (a runaway loop?); {FUEL_ENV} raises the limit",
                self.name,
                self.fuel
            )).into()),
            Err(e) => Err(e).with_context(|| format!("chat template {}", self.name)),
        }
    }
}

/// About the bytes of `v` as JSON: its strings and keys, and a few bytes per other value.
fn json_bytes(v: &Json) -> usize {
    match v {
        Json::String(s) => s.len() + 2,
        Json::Array(items) => items.iter().map(json_bytes).sum::<usize>() + 2,
        Json::Object(map) => map.iter().map(|(k, v)| k.len() + 4 + json_bytes(v)).sum(),
        _ => 8,
    }
}

/// transformers 5.x fills `reasoning_content` and `thinking` of a message from the first
/// non-null of `reasoning_content` / `thinking` / `reasoning`, as `{"thinking": r, **m,
/// "reasoning_content": r}` (the key order matters to `tojson`).
fn alias_reasoning(message: &Json) -> Json {
    let Some(m) = message.as_object() else {
        return message.clone();
    };
    let Some(r) = ["reasoning_content", "thinking", "reasoning"]
        .iter()
        .find_map(|k| m.get(*k).filter(|v| !v.is_null()))
    else {
        return message.clone();
    };
    let mut out = Map::new();
    out.insert("thinking".into(), r.clone());
    out.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
    out.insert("reasoning_content".into(), r.clone());
    Json::Object(out)
}

/// Python's `str(value)`, which is what jinja2 prints for `{{ value }}` and `|string`; at most
/// what the byte budget has left.
fn py_str(v: &Value) -> Result<String, Error> {
    let mut out = String::new();
    match v.kind() {
        ValueKind::String => push(&mut out, v.as_str().unwrap_or_default())?,
        ValueKind::Undefined => {}
        _ => py_repr(v, &mut out)?,
    }
    Ok(out)
}

/// Appends `s`, refusing to grow `out` past what the byte budget has left.
fn push(out: &mut String, s: &str) -> Result<(), Error> {
    budget::check(out.len().saturating_add(s.len()))?;
    out.push_str(s);
    Ok(())
}

/// Python's `repr(value)` for the types a template sees (True, None, ['a'], {'k': 1}).
fn py_repr(v: &Value, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => push(out, "None")?,
        ValueKind::Bool => push(out, if v.is_true() { "True" } else { "False" })?,
        ValueKind::Number if !v.is_integer() => push(
            out,
            &py_float(f64::try_from(v.clone()).unwrap_or(f64::NAN), false),
        )?,
        ValueKind::String => {
            let s = v.as_str().unwrap_or_default();
            let q = if s.contains('\'') && !s.contains('"') {
                '"'
            } else {
                '\''
            };
            // At most four bytes out per byte in (`\x01`).
            budget::check(out.len().saturating_add(s.len().saturating_mul(4) + 2))?;
            out.push(q);
            for c in s.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    c if c == q => out.extend(['\\', c]),
                    c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                        out.push_str(&format!("\\x{:02x}", c as u32))
                    }
                    c => out.push(c),
                }
            }
            out.push(q);
        }
        ValueKind::Seq | ValueKind::Iterable => py_items(v, ("[", "]"), out, py_repr)?,
        ValueKind::Map => py_items(v, ("{", "}"), out, |k, out| {
            py_repr(k, out)?;
            push(out, ": ")?;
            py_repr(&v.get_item(k).unwrap_or_default(), out)
        })?,
        _ => push(out, &v.to_string())?,
    }
    Ok(())
}

/// The items of `v` (a map's keys) between `open` and `close`, each written by `item`,
/// separated by ", ".
fn py_items(
    v: &Value,
    (open, close): (&str, &str),
    out: &mut String,
    mut item: impl FnMut(&Value, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    push(out, open)?;
    for (i, x) in v.try_iter().into_iter().flatten().enumerate() {
        if i > 0 {
            push(out, ", ")?;
        }
        item(&x, out)?;
    }
    push(out, close)
}

/// Python's `repr(float)`: shortest round-trip digits, positional for 1e-4 <= |x| < 1e16 (with a
/// `.0` when integral), else `1e-05` style. `json` spells the non-finite values as json.dumps does.
fn py_float(f: f64, json: bool) -> String {
    if !f.is_finite() {
        let s = match (f.is_nan(), f > 0.0, json) {
            (true, _, false) => "nan",
            (true, _, true) => "NaN",
            (_, true, false) => "inf",
            (_, true, true) => "Infinity",
            (_, false, false) => "-inf",
            (_, false, true) => "-Infinity",
        };
        return s.into();
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    if (-4..16).contains(&exp) {
        let s = f.to_string();
        if s.contains('.') {
            s
        } else {
            s + ".0"
        }
    } else {
        format!(
            "{mantissa}e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    }
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)` — ", " and ": " separators, insertion order, no HTML escaping.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => {
            Some(v.as_str().unwrap_or_default().to_string())
        }
        Some(v) => {
            let width = v
                .as_usize()
                .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "tojson: bad indent"))?;
            budget::check(width)?;
            Some(" ".repeat(width))
        }
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(pair) if pair.len() == 2 => (pair[0].clone(), pair[1].clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            ))
        }
        // json.dumps puts no space before the newline of an indented item.
        None => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    style.write(value, 0, &mut out)?;
    budget::charge(out.len())?;
    Ok(out)
}

struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl JsonStyle {
    fn write(&self, v: &Value, level: usize, out: &mut String) -> Result<(), Error> {
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => out.push_str(&v.to_string()),
            ValueKind::Number => out.push_str(&py_float(f64::try_from(v.clone())?, true)),
            ValueKind::String => self.write_str(v.as_str().unwrap_or_default(), out)?,
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.write_container(out, level, ('[', ']'), &items, |item, out| {
                    self.write(item, level + 1, out)
                })?;
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for k in v.try_iter()? {
                    entries.push((self.key(&k)?, v.get_item(&k)?));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.write_container(out, level, ('{', '}'), &entries, |(k, val), out| {
                    self.write_str(k, out)?;
                    push(out, &self.key_sep)?;
                    self.write(val, level + 1, out)
                })?;
            }
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("Object of type {kind} is not JSON serializable"),
                ))
            }
        }
        Ok(())
    }

    fn write_container<T>(
        &self,
        out: &mut String,
        level: usize,
        (open, close): (char, char),
        items: &[T],
        mut each: impl FnMut(&T, &mut String) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return Ok(());
        }
        let newline = |out: &mut String, level: usize| -> Result<(), Error> {
            if let Some(indent) = &self.indent {
                budget::check(budget::mul_add(indent.len(), level, out.len() + 1))?;
                out.push('\n');
                out.push_str(&indent.repeat(level));
            }
            Ok(())
        };
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                push(out, &self.item_sep)?;
            }
            newline(out, level + 1)?;
            each(item, out)?;
        }
        newline(out, level)?;
        out.push(close);
        Ok(())
    }

    /// json.dumps turns non-string keys into strings: 1 -> "1", True -> "true", None -> "null".
    fn key(&self, k: &Value) -> Result<String, Error> {
        Ok(match k.kind() {
            ValueKind::String => k.as_str().unwrap_or_default().to_string(),
            ValueKind::None | ValueKind::Bool | ValueKind::Number => {
                let mut s = String::new();
                self.write(k, 0, &mut s)?;
                s
            }
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("keys must be str, int, float, bool or None, not {kind}"),
                ))
            }
        })
    }

    fn write_str(&self, s: &str, out: &mut String) -> Result<(), Error> {
        // At most twelve bytes out per character in (a surrogate pair `\ud83d\ude00`).
        budget::check(budget::mul_add(s.len(), 12, out.len() + 2))?;
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
        Ok(())
    }
}

/// `strftime_now(fmt)`: the local time formatted by C's strftime, as Python's
/// `datetime.now().strftime(fmt)` (templates use it for "Today's date").
fn strftime_now(format: String) -> Result<String, Error> {
    let fmt = std::ffi::CString::new(format)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut buf = [0u8; 256];
    // SAFETY: plain libc calls on stack values; strftime writes at most buf.len() bytes.
    let n = unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        libc::strftime(buf.as_mut_ptr().cast(), buf.len(), fmt.as_ptr(), &tm)
    };
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/chat-templates")
    }

    /// Every reference rendering made by transformers (gen_vectors.py) must match byte for byte,
    /// and every expected template error must be raised.
    #[test]
    fn all_reference_vectors_match() {
        let dir = data_dir();
        let doc: Json =
            serde_json::from_str(&std::fs::read_to_string(dir.join("vectors.json")).unwrap())
                .unwrap();
        let vectors = doc["vectors"].as_array().unwrap();
        let (mut texts, mut errors, mut failures) = (0, 0, Vec::new());
        for v in vectors {
            let id = v["id"].as_str().unwrap();
            let file = v["template"].as_str().unwrap();
            let source = std::fs::read_to_string(dir.join(file)).unwrap();
            let template = ChatTemplate::new(file.into(), source).unwrap();
            let messages = v["messages"].as_array().unwrap();
            let tools = Some(&v["tools"]).filter(|t| !t.is_null());
            let kwargs = v["kwargs"].as_object().unwrap();
            let got = template.render(
                messages,
                tools,
                v["add_generation_prompt"].as_bool().unwrap(),
                kwargs,
            );
            match (v.get("expected_text").and_then(Json::as_str), got) {
                (Some(want), Ok(got)) if got == want => texts += 1,
                (Some(want), Ok(got)) => {
                    failures.push(format!("{id}: rendered\n{got:?}\nwant\n{want:?}"))
                }
                (Some(_), Err(e)) => failures.push(format!("{id}: {e:#}")),
                (None, Ok(got)) => {
                    failures.push(format!("{id}: expected an error, rendered {got:?}"))
                }
                (None, Err(e)) => {
                    // "TemplateError: <msg>" comes from raise_exception and must carry the message.
                    let want = v["expected_error"].as_str().unwrap();
                    match want.strip_prefix("TemplateError: ") {
                        Some(msg) if !format!("{e:#}").contains(msg) => {
                            failures.push(format!("{id}: {e:#} lacks {msg:?}"))
                        }
                        _ => errors += 1,
                    }
                }
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} vectors fail:\n{}",
            failures.len(),
            vectors.len(),
            failures.join("\n\n")
        );
        assert_eq!((texts, errors), (79, 8), "vectors.json changed size");
    }

    fn render(source: &str, ctx: Json) -> String {
        let t = ChatTemplate::new("t".into(), source.into()).unwrap();
        let extra = ctx.as_object().unwrap().clone();
        t.render(&[], None, false, &extra).unwrap()
    }

    #[test]
    fn python_semantics() {
        let ctx =
            serde_json::json!({"x": {"b": [1, 2.5, true, null, "é\"<&>"], "a": 1e-7}, "f": 3.0});
        assert_eq!(
            render("{{ x | tojson }}", ctx.clone()),
            r#"{"b": [1, 2.5, true, null, "é\"<&>"], "a": 1e-07}"#
        );
        assert_eq!(
            render("{{ x | tojson(indent=2, sort_keys=true) }}", ctx.clone()),
            "{\n  \"a\": 1e-07,\n  \"b\": [\n    1,\n    2.5,\n    true,\n    null,\n    \"é\\\"<&>\"\n  ]\n}"
        );
        assert_eq!(
            render("{{ x.b }}|{{ x.b[2] }}|{{ f }}|{{ none }}", ctx.clone()),
            r#"[1, 2.5, True, None, 'é"<&>']|True|3.0|None"#
        );
        assert_eq!(
            render("{{ x.b[2] | string }} {{ '  a b '.strip() }}", ctx.clone()),
            "True a b"
        );
        assert_eq!(
            render("{{ 'x\n' }}\n", ctx),
            "x\n",
            "one trailing newline of the template is dropped"
        );
        assert_eq!(py_float(1e16, false), "1e+16");
        assert_eq!(py_float(123456.0, false), "123456.0");
        assert_eq!(py_float(-0.0001, false), "-0.0001");
        assert!(render("{{ strftime_now('%Y') }}", serde_json::json!({})).starts_with("20"));
    }

    #[test]
    fn template_from_tokenizer_config() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = serde_json::json!({"chat_template": [
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": "D{{ messages|length }}"},
        ]});
        let t = ChatTemplate::from_dir(dir.path(), Some(&cfg))
            .unwrap()
            .unwrap();
        assert_eq!(
            t.render(
                &[serde_json::json!({"role": "user", "content": "hi"})],
                None,
                true,
                &Map::new()
            )
            .unwrap(),
            "D1"
        );
        assert!(ChatTemplate::from_dir(dir.path(), None).unwrap().is_none());
        std::fs::write(dir.path().join("chat_template.jinja"), "F").unwrap();
        let t = ChatTemplate::from_dir(dir.path(), Some(&cfg))
            .unwrap()
            .unwrap();
        assert_eq!(
            t.render(&[], None, true, &Map::new()).unwrap(),
            "F",
            "chat_template.jinja wins"
        );
    }

    /// Templates that build gigabytes from a few bytes of source, each a different way.
    fn hostile() -> Vec<(&'static str, String)> {
        let mut list: Vec<(&str, String)> = HOSTILE
            .iter()
            .map(|(what, source)| (*what, source.to_string()))
            .collect();
        list.push(("straight-line doubling", const_str_doubling()));
        list.push(("raw text in a capture", raw_text_loop()));
        list
    }

    const HOSTILE: [(&str, &str); 20] = [
        ("doubling loop", "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}"),
        ("doubling with +", "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"),
        ("repetition", "{{ ('x' * 100000000)|length }}"),
        ("huge indent", "{{ 'a\\nb'|indent(10000000000) }}"),
        ("huge indent keyword", "{{ 'a\\nb'|indent(width=10000000000) }}"),
        ("huge printf width", "{{ '%10000000000d'|format(1) }}"),
        ("huge format width", "{{ '{:>10000000000}'.format(1) }}"),
        ("centred by format", "{{ '{:^10000000000}'.format(1) }}"),
        ("width from an argument", "{{ '{:{w}}'.format(1, w=10000000000) }}"),
        ("star width", "{{ '%*d'|format(10000000000, 1) }}"),
        ("range product", "{{ (range(100000)|list) * 100000 }}"),
        ("range product joined", "{{ ((range(100000)|list) * 100000)|join(',') }}"),
        ("range product in", "{{ -1 in (range(100000)|list) * 100000 * 100000 }}"),
        ("list doubling", "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}"),
        ("replace empty", "{% set ns = namespace(s='xxxxxxxxxx') %}{% for i in range(30) %}{% set ns.s = ns.s.replace('', 'yy') %}{% endfor %}"),
        ("capture doubling", "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set t %}{{ ns.s }}{{ ns.s }}{% endset %}{% set ns.s = t %}{% endfor %}"),
        ("macro doubling", "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% else %}{{ s|length }}{% endif %}{% endmacro %}{{ d('x', 40) }}"),
        ("tojson indent", "{{ [1]|tojson(indent=10000000000) }}"),
        ("unpacking", "{% set a, b = (range(100000)|list) * 100000000 %}"),
        ("spread", "{{ range(*((range(100000)|list) * 100000000)) }}"),
    ];

    fn const_str_doubling() -> String {
        let mut t = String::from("{% set s = 'x' %}");
        for _ in 0..40 {
            t.push_str("{% set s = s ~ s %}");
        }
        t + "{{ s|length }}"
    }

    fn raw_text_loop() -> String {
        let text = "y".repeat(1000);
        format!(
            "{{% set t %}}{{% for i in range(100000) %}}{{% for j in range(1000) %}}{text}{{% endfor %}}{{% endfor %}}{{% endset %}}"
        )
    }

    #[test]
    fn hostile_templates_stop_at_the_byte_budget() {
        for (what, source) in hostile() {
            let err = quick_render_error(what, source);
            assert!(
                err.contains("t.jinja")
                    && err.contains("bytes of text and lists")
                    && err.contains(BYTES_ENV),
                "{what}: {err}"
            );
            assert!(!err.contains('\n'), "{what}: {err}");
        }
    }

    /// The error of rendering the template `source` (as `t.jinja`), which must come quickly.
    fn quick_render_error(what: &str, source: String) -> String {
        let start = std::time::Instant::now();
        let t = ChatTemplate::new("t.jinja".into(), source).unwrap();
        let err = t.render(&[], None, false, &Map::new()).expect_err(what);
        // A bound with headroom for a loaded 2-core machine (2.9 s alone, up to 8.9 s at
        // load 9 were seen): an unbounded render of these templates runs for hours.
        assert!(
            start.elapsed().as_secs() < 30,
            "{what}: took {:?}",
            start.elapsed()
        );
        format!("{err:#}")
    }

    /// Recursion and nesting, which would overflow the stack rather than the memory: each is
    /// one error, quickly.
    #[test]
    fn deep_templates_end_in_one_error() {
        let nested = "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}";
        let cases = [
            ("macro recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}".to_string(), "recursion limit"),
            ("loop recursion", "{% for x in [[1]] recursive %}{{ loop([x]) }}{% endfor %}".into(), "recursion limit"),
            ("nested lists printed", format!("{nested}{{{{ ns.x }}}}"), "nested more than 256 deep"),
            ("nested lists joined", format!("{nested}{{{{ ns.x ~ '' }}}}"), "nested more than 256 deep"),
            ("nested lists dropped", format!("{nested}done"), "nested more than 256 deep"),
            ("nested maps", "{% set ns = namespace(x={}) %}{% for i in range(100000) %}{% set ns.x = {'a': ns.x} %}{% endfor %}".into(), "nested more than 256 deep"),
            ("nested by a filter", "{% set ns = namespace(x=[1]) %}{% for i in range(100000) %}{% set ns.x = ns.x|batch(1) %}{% endfor %}".into(), "nested more than 256 deep"),
            ("a namespace holding itself", "{% set ns = namespace(a=1) %}{% set ns.x = ns %}{{ ns }}".into(), "holds itself"),
            ("a namespace holding itself in a list", "{% set ns = namespace(a=1) %}{% set ns.x = [{'k': ns}] %}{{ ns|tojson }}".into(), "holds itself"),
            ("an unknown filter", "{{ 'x'|center(10000000000) }}".into(), "center is unknown"),
        ];
        for (what, source, needle) in cases {
            let err = quick_render_error(what, source);
            assert!(
                err.contains("t.jinja") && err.contains(needle),
                "{what}: {err}"
            );
        }
    }

    /// The budget grows with the input: the real templates render a conversation of long
    /// messages (they build about 6 bytes per byte of it) with the default budget.
    #[test]
    fn long_conversations_fit_the_default_budget() {
        let big = "word ".repeat(1 << 20); // 5 MiB
        let messages = [
            serde_json::json!({"role": "system", "content": big}),
            serde_json::json!({"role": "user", "content": big}),
            serde_json::json!({"role": "assistant", "content": format!("<think>{big}</think>{big}")}),
            serde_json::json!({"role": "user", "content": big}),
        ];
        for file in [
            "qwen3-next-instruct.jinja",
            "qwen3-next-thinking.jinja",
            "qwen3.5.jinja",
            "qwen3.6.jinja",
        ] {
            let source = std::fs::read_to_string(data_dir().join(file)).unwrap();
            let t = ChatTemplate::new(file.into(), source).unwrap();
            let text = t.render(&messages, None, true, &Map::new()).unwrap();
            assert!(text.len() > 4 * big.len(), "{file}");
        }
    }
}
