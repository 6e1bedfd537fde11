//! Budget checks on everything a template can call or compute: the guards that
//! [`super::rewrite`] puts before `~`, `+`, `*`, slicing, `in` and unpacking, and bounded
//! versions of minijinja's filters and of the Python string methods.
//!
//! Each check bounds what the call would build from its arguments *before* the call (a width
//! of 10^9 or a list repeated 10^18 times is refused without being built), then charges what
//! it did build. A list that is not built yet (`[x] * n`, `a + b` of lists) is still bounded
//! by the budget, so that iterating over it cannot run for ever either.

use super::budget::{
    self, built_bytes, charge, check, check_nesting, display_len, items, mul_add, str_len,
    MAX_NESTING, VALUE_BYTES,
};
use super::rewrite;
use minijinja::value::{Rest, Value, ValueKind};
use minijinja::{filters, Environment, Error, State};

/// Registers the guards and replaces minijinja's filters and the pycompat methods by bounded
/// versions.
pub fn register(env: &mut Environment<'static>) {
    env.add_function(rewrite::CONCAT, |a: Value, b: Value| {
        charge(display_len(&a)?.saturating_add(display_len(&b)?))?;
        Ok(operands(vec![a, b]))
    });
    env.add_function(rewrite::ADD, |a: Value, b: Value| {
        if let (Some(x), Some(y)) = (a.as_str(), b.as_str()) {
            charge(x.len().saturating_add(y.len()))?;
        } else if is_list(&a) && is_list(&b) {
            let bytes = mul_add(items(&a)?.saturating_add(items(&b)?), VALUE_BYTES, 0);
            check(bytes)?;
            // minijinja keeps `a + b` of lists lazy and copies the chain into one list once it
            // is 32 additions deep: `list = list + [x]` in a loop copies 1/32 of it each time.
            charge(bytes / 32)?;
        }
        Ok(operands(vec![a, b]))
    });
    env.add_function(rewrite::MUL, |a: Value, b: Value| {
        let (one, times) = if a.is_integer() { (&b, &a) } else { (&a, &b) };
        if let Some(times) = times.as_usize() {
            if let Some(s) = one.as_str() {
                charge(mul_add(s.len(), times, 0))?;
            } else if is_list(one) {
                // Lazy, but bounded as if built.
                check(mul_add(mul_add(items(one)?, times, 0), VALUE_BYTES, 0))?;
            }
        }
        Ok(operands(vec![a, b]))
    });
    env.add_function(
        rewrite::SLICE,
        |value: Value, start: Value, stop: Value, step: Value| {
            // At most the whole value.
            charge(if value.as_str().is_some() {
                str_len(&value)
            } else {
                mul_add(items(&value)?, VALUE_BYTES, 0)
            })?;
            Ok(operands(vec![value, start, stop, step]))
        },
    );
    env.add_function(rewrite::CONTAINS, |needle: Value, haystack: Value| {
        if haystack.as_str().is_some() && needle.as_str().is_none() {
            // `x in 'text'` formats x.
            charge(display_len(&needle)?)?;
        } else {
            items(&haystack)?;
        }
        Ok(operands(vec![needle, haystack]))
    });
    env.add_function(rewrite::UNPACK, |value: Value, _expected: usize| {
        check(mul_add(items(&value)?, VALUE_BYTES, 0))?;
        Ok(value)
    });
    env.add_function(rewrite::SPREAD, |lists: Rest<Value>| {
        let mut n = 0usize;
        for list in lists.iter() {
            n = n.saturating_add(items(list)?);
        }
        check(mul_add(n, VALUE_BYTES, 0))?;
        Ok(operands(lists.0))
    });

    env.add_function(rewrite::NEST, |items: Rest<Value>| {
        for item in items.iter() {
            check_nesting(item, MAX_NESTING - 1, None)?;
        }
        Ok(operands(items.0))
    });
    env.add_function(rewrite::SET_ATTR, |value: Value, namespace: Value| {
        check_nesting(&value, MAX_NESTING - 1, Some(&namespace))?;
        Ok(operands(vec![value, namespace]))
    });

    for (name, filter) in builtin_filters() {
        env.add_filter(
            name,
            move |state: &State, args: Rest<Value>| -> Result<Value, Error> {
                check(filter_bytes(name, &args)?)?;
                let out = filter.call(state, &args)?;
                charge(built_bytes(&out))?;
                // batch, slice, groupby, zip, items... put their input one level deeper.
                check_nesting(&out, MAX_NESTING, None)?;
                Ok(out)
            },
        );
    }
    env.set_unknown_method_callback(|state, value, method, args| {
        check(method_bytes(value, method, args)?)?;
        let out = minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)?;
        charge(built_bytes(&out))?;
        check_nesting(&out, MAX_NESTING, None)?;
        Ok(out)
    });
}

/// The operands handed back to the instruction: UnpackList pushes the items of a list with
/// the first on top (for `{% set a, b = ... %}`), so they go in last first.
fn operands(mut values: Vec<Value>) -> Value {
    values.reverse();
    Value::from(values)
}

fn is_list(v: &Value) -> bool {
    matches!(v.kind(), ValueKind::Seq | ValueKind::Iterable)
}

/// minijinja's filters that are replaced by a bounded call of themselves (`string` and
/// `tojson` have Python versions of their own, in chat_template.rs).
fn builtin_filters() -> Vec<(&'static str, Value)> {
    vec![
        ("safe", Value::from_function(filters::safe)),
        ("escape", Value::from_function(filters::escape)),
        ("e", Value::from_function(filters::escape)),
        ("lower", Value::from_function(filters::lower)),
        ("upper", Value::from_function(filters::upper)),
        ("title", Value::from_function(filters::title)),
        ("capitalize", Value::from_function(filters::capitalize)),
        ("replace", Value::from_function(filters::replace)),
        ("length", Value::from_function(filters::length)),
        ("count", Value::from_function(filters::length)),
        ("dictsort", Value::from_function(filters::dictsort)),
        ("items", Value::from_function(filters::items)),
        ("reverse", Value::from_function(filters::reverse)),
        ("trim", Value::from_function(filters::trim)),
        ("join", Value::from_function(filters::join)),
        ("split", Value::from_function(filters::split)),
        ("lines", Value::from_function(filters::lines)),
        ("default", Value::from_function(filters::default)),
        ("d", Value::from_function(filters::default)),
        ("round", Value::from_function(filters::round)),
        ("abs", Value::from_function(filters::abs)),
        ("int", Value::from_function(filters::int)),
        ("float", Value::from_function(filters::float)),
        ("attr", Value::from_function(filters::attr)),
        ("first", Value::from_function(filters::first)),
        ("last", Value::from_function(filters::last)),
        ("min", Value::from_function(filters::min)),
        ("max", Value::from_function(filters::max)),
        ("sort", Value::from_function(filters::sort)),
        ("list", Value::from_function(filters::list)),
        ("bool", Value::from_function(filters::bool)),
        ("batch", Value::from_function(filters::batch)),
        ("slice", Value::from_function(filters::slice)),
        ("sum", Value::from_function(filters::sum)),
        ("indent", Value::from_function(filters::indent)),
        ("select", Value::from_function(filters::select)),
        ("reject", Value::from_function(filters::reject)),
        ("selectattr", Value::from_function(filters::selectattr)),
        ("rejectattr", Value::from_function(filters::rejectattr)),
        ("map", Value::from_function(filters::map)),
        ("groupby", Value::from_function(filters::groupby)),
        ("unique", Value::from_function(filters::unique)),
        ("chain", Value::from_function(filters::chain)),
        ("zip", Value::from_function(filters::zip)),
        ("pprint", Value::from_function(filters::pprint)),
        ("format", Value::from_function(filters::format)),
    ]
}

/// At most what filter `name` builds from `args` (its input first).
fn filter_bytes(name: &str, args: &[Value]) -> Result<usize, Error> {
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    let input = arg(0);
    Ok(match name {
        "indent" => {
            let width = kwarg(args, "width")
                .or_else(|| args.get(1).filter(|v| v.is_integer()).cloned())
                .and_then(|w| w.as_usize())
                .unwrap_or(4);
            let text = input.as_str().unwrap_or_default();
            mul_add(text.matches('\n').count() + 1, width, text.len())
        }
        "format" => format_bytes(
            input.as_str().unwrap_or_default(),
            &args[1.min(args.len())..],
        )?,
        "replace" => replace_bytes(&input, &arg(1), &arg(2)),
        "join" => join_bytes(&input, arg(1).as_str().unwrap_or_default())?,
        "split" => split_bytes(&input, arg(1).as_str()),
        "lines" => split_bytes(&input, Some("\n")),
        // Unicode case mapping makes at most three characters of one.
        "lower" | "upper" | "title" | "capitalize" => str_len(&input).saturating_mul(3),
        // `&quot;` for `"`.
        "escape" | "e" => display_len(&input)?.saturating_mul(6),
        // `{:#?}`: one item per line, indented by its depth.
        "pprint" => display_len(&input)?.saturating_mul(8),
        "trim" | "safe" => str_len(&input),
        "batch" | "slice" => mul_add(
            items(&input)?.saturating_add(arg(1).as_usize().unwrap_or(0)),
            VALUE_BYTES * 2,
            0,
        ),
        "chain" | "zip" => {
            let mut n = 0usize;
            for a in args {
                n = n.saturating_add(items(a)?);
            }
            mul_add(n, VALUE_BYTES, 0)
        }
        // The rest builds (or walks) at most one value per item of its input.
        _ => mul_add(items(&input)?, VALUE_BYTES, 0),
    })
}

/// At most what `value.method(args)` builds, for pycompat's methods.
fn method_bytes(value: &Value, method: &str, args: &[Value]) -> Result<usize, Error> {
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    if value.as_str().is_none() {
        // keys(), values(), items(), get(), count().
        return Ok(mul_add(items(value)?, VALUE_BYTES * 2, 0));
    }
    Ok(match method {
        "format" => format_bytes(value.as_str().unwrap_or_default(), args)?,
        "replace" => replace_bytes(value, &arg(0), &arg(1)),
        "join" => join_bytes(&arg(0), value.as_str().unwrap_or_default())?,
        "split" => split_bytes(value, arg(0).as_str()),
        "splitlines" => split_bytes(value, Some("\n")),
        "upper" | "lower" | "title" | "capitalize" => str_len(value).saturating_mul(3),
        _ => str_len(value),
    })
}

fn kwarg(args: &[Value], name: &str) -> Option<Value> {
    let kwargs = args.last().filter(|v| v.kind() == ValueKind::Map)?;
    kwargs.get_attr(name).ok().filter(|v| !v.is_undefined())
}

/// `text.replace(old, new)`: every match of `old` becomes `new` (an empty `old` matches
/// between every two characters).
fn replace_bytes(text: &Value, old: &Value, new: &Value) -> usize {
    let (text, old) = (
        text.as_str().unwrap_or_default(),
        old.as_str().unwrap_or_default(),
    );
    let matches = if old.is_empty() {
        text.chars().count() + 1
    } else {
        text.matches(old).count()
    };
    mul_add(matches, str_len(new), text.len())
}

/// `sep.join(items)`: every item printed, and a separator between two.
fn join_bytes(list: &Value, sep: &str) -> Result<usize, Error> {
    if list.as_str().is_some() {
        return Ok(mul_add(str_len(list), sep.len() + 4, 0));
    }
    let mut total = 0usize;
    let mut count = 0usize;
    if let Ok(iter) = list.try_iter() {
        for item in iter.take(budget::left() / VALUE_BYTES + 1) {
            total = mul_add(1, display_len(&item)?, total).saturating_add(sep.len());
            count += 1;
            check(total)?;
        }
    }
    check(mul_add(count, VALUE_BYTES, 0))?;
    Ok(total)
}

/// `text.split(sep)` (on whitespace without `sep`): the pieces and one value each.
fn split_bytes(text: &Value, sep: Option<&str>) -> usize {
    let s = text.as_str().unwrap_or_default();
    let pieces = match sep {
        Some("") => 1,
        Some(sep) => s.matches(sep).count() + 1,
        None => s.split_whitespace().count(),
    };
    mul_add(pieces, VALUE_BYTES, s.len())
}

/// `fmt % args`, `fmt | format(args)` or `fmt.format(args)`: each placeholder prints an
/// argument padded to a width that the format spells (`%999d`, `{:>999}`) or takes from an
/// argument (`%*d`, `{:{w}}`).
fn format_bytes(fmt: &str, args: &[Value]) -> Result<usize, Error> {
    let placeholders = fmt.matches(['%', '{']).count();
    let mut widest_arg = 0usize;
    let mut largest_int = 0usize;
    for a in args {
        widest_arg = widest_arg.max(display_len(a)?);
        // Keyword arguments come as one map: its values may be widths too.
        let values: Vec<Value> = if a.kind() == ValueKind::Map {
            a.try_iter()
                .into_iter()
                .flatten()
                .filter_map(|k| a.get_item(&k).ok())
                .collect()
        } else {
            vec![a.clone()]
        };
        for v in values.iter().filter(|v| v.is_integer()) {
            largest_int = largest_int.max(v.as_usize().unwrap_or(usize::MAX));
        }
    }
    let spelled_width = fmt
        .split(|c: char| !c.is_ascii_digit())
        .filter(|d| !d.is_empty())
        .map(|d| d.parse::<usize>().unwrap_or(usize::MAX))
        .max()
        .unwrap_or(0);
    let width = if fmt.contains('*') || nested_field(fmt) {
        spelled_width.max(largest_int)
    } else {
        spelled_width
    };
    Ok(mul_add(
        placeholders,
        widest_arg.saturating_add(width),
        fmt.len(),
    ))
}

/// Whether a `{...}` field holds another one (`{:{width}}`), whose value is an argument.
fn nested_field(fmt: &str) -> bool {
    let mut depth = 0usize;
    for c in fmt.chars() {
        match c {
            '{' if depth > 0 => return true,
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}
