//! The compiled template, with a budget check before every instruction that can build a large
//! value by itself. minijinja lets filters, functions and methods be replaced, but `~`, `+`,
//! `*`, slicing, `in`, unpacking and raw text are VM instructions with no hook, and a few of
//! them (`{% set s = s ~ s %}` forty times) reach terabytes. So each of those instructions is
//! preceded by a call to a guard of [`super::guards`] that looks at its operands and refuses
//! (or charges) what the instruction would build; the instruction itself then runs unchanged,
//! so the template's semantics stay minijinja's.
//!
//! A guard is a global function whose name no template can spell (it starts with `~`), so a
//! template variable cannot shadow it. Inserting instructions moves the ones after them, so
//! every jump target and macro offset is mapped to its new index.

use minijinja::machinery::{Instruction, Instructions};
use minijinja::value::Value;

/// Global functions the rewritten code calls (registered by `super::guards::register`).
pub const CONCAT: &str = "~concat";
pub const ADD: &str = "~add";
pub const MUL: &str = "~mul";
pub const SLICE: &str = "~slice";
pub const CONTAINS: &str = "~in";
pub const UNPACK: &str = "~unpack";
pub const SPREAD: &str = "~spread";
pub const NEST: &str = "~nest";
pub const SET_ATTR: &str = "~setattr";

/// `code` with the guards inserted.
pub fn guarded<'s>(code: &Instructions<'s>) -> Instructions<'s> {
    let len = code.len() as u32;
    let instruction = |i: u32| code.get(i).expect("index below len");
    // Where each old instruction starts in the new code (and the end, a valid jump target).
    let mut start = Vec::with_capacity(len as usize + 1);
    let mut at = 0u32;
    for i in 0..len {
        start.push(at);
        at += expand(instruction(i), &[]).len() as u32;
    }
    start.push(at);
    let mut out = Instructions::new(code.name(), code.source());
    for i in 0..len {
        for new in expand(instruction(i), &start) {
            match code.get_line(i) {
                Some(line) => out.add_with_line(new, line.min(u16::MAX as usize) as u16),
                None => out.add(new),
            };
        }
    }
    out
}

/// The instructions that replace `instr`. `start` maps old indices to new ones (empty while
/// only counting).
fn expand<'s>(instr: &Instruction<'s>, start: &[u32]) -> Vec<Instruction<'s>> {
    let to = |target: &u32| start.get(*target as usize).copied().unwrap_or(0);
    // The guard hands its operands back as one list, which UnpackList spreads on the stack
    // again for the original instruction.
    let guard = |name: &'static str, operands: u16| {
        vec![
            Instruction::CallFunction(name, Some(operands)),
            Instruction::UnpackList(operands as usize),
            instr.clone(),
        ]
    };
    let nest = |operands: usize| match u16::try_from(operands) {
        Ok(0) | Err(_) => vec![instr.clone()],
        Ok(n) => guard(NEST, n),
    };
    use Instruction as I;
    match instr {
        // Raw text is printed through the formatter, which counts every byte printed, into the
        // output or into a capture (`{% set x %}`, a macro's body).
        I::EmitRaw(text) => vec![I::LoadConst(Value::from(*text)), I::Emit],
        I::StringConcat => guard(CONCAT, 2),
        I::Add => guard(ADD, 2),
        I::Mul => guard(MUL, 2),
        I::In => guard(CONTAINS, 2),
        I::Slice => guard(SLICE, 4),
        // Unpacking pushes every item of the value before it counts them.
        I::UnpackList(n) => vec![
            I::LoadConst(Value::from(*n)),
            I::CallFunction(UNPACK, Some(2)),
            instr.clone(),
        ],
        I::UnpackLists(n) => match u16::try_from(*n) {
            Ok(n) => guard(SPREAD, n),
            Err(_) => vec![instr.clone()],
        },
        // A literal list or map nests its items one level deeper.
        I::BuildList(Some(n)) => nest(*n),
        I::BuildMap(n) | I::BuildKwargs(n) => nest(n.saturating_mul(2)),
        // A namespace could be made to hold itself.
        I::SetAttr(_) => guard(SET_ATTR, 2),
        I::Jump(t) => vec![I::Jump(to(t))],
        I::JumpIfFalse(t) => vec![I::JumpIfFalse(to(t))],
        I::JumpIfFalseOrPop(t) => vec![I::JumpIfFalseOrPop(to(t))],
        I::JumpIfTrueOrPop(t) => vec![I::JumpIfTrueOrPop(to(t))],
        I::Iterate(t) => vec![I::Iterate(to(t))],
        I::BuildMacro(name, t, flags) => vec![I::BuildMacro(name, to(t), *flags)],
        // Every other instruction is listed, without a wildcard, so that a minijinja upgrade
        // that adds one fails to compile here until it has been looked at.
        I::StoreLocal(_)
        | I::Lookup(_)
        | I::GetAttr(_)
        | I::GetItem
        | I::LoadConst(_)
        // Merges maps already checked; a list of the items just unpacked from others.
        | I::MergeKwargs(_)
        | I::BuildList(None)
        | I::Sub
        | I::Div
        | I::IntDiv
        | I::Rem
        | I::Pow
        | I::Neg
        | I::Eq
        | I::Ne
        | I::Gt
        | I::Gte
        | I::Lt
        | I::Lte
        | I::Not
        | I::CompareAndPreserve(_)
        // Filters, tests, functions and methods are wrapped where they are registered.
        | I::ApplyFilter(..)
        | I::PerformTest(..)
        | I::CallFunction(..)
        | I::CallMethod(..)
        | I::CallObject(_)
        // Counted by the formatter.
        | I::Emit
        | I::PushLoop(_)
        | I::PushWith
        | I::PushDidNotIterate
        | I::PopFrame
        | I::PopLoopFrame
        | I::PushAutoEscape
        | I::PopAutoEscape
        | I::BeginCapture(_)
        | I::EndCapture
        | I::DupTop
        | I::DiscardTop
        | I::FastSuper
        | I::FastRecurse
        | I::Swap
        | I::CallBlock(_)
        | I::LoadBlocks
        | I::Include(_)
        | I::ExportLocals
        | I::Return
        | I::IsUndefined
        | I::Enclose(_)
        | I::GetClosure => vec![instr.clone()],
    }
}
