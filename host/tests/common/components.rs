//! Components built byte by byte for the deploy-path tests: valid Wasm of a chosen shape (many
//! or large functions, many modules), and the test guests with extra sections.

use super::guest;

pub fn leb(mut n: usize, out: &mut Vec<u8>) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Appends a section (`id`, then the LEB128 length, then `body`).
pub fn section(id: u8, body: &[u8], out: &mut Vec<u8>) {
    out.push(id);
    leb(body.len(), out);
    out.extend_from_slice(body);
}

/// A core module of `functions` functions `() -> ()` with one i32 local, each about
/// `body_bytes` of `local.get 0; i32.const 1; i32.add; local.set 0` repeated: valid code that
/// makes a compiler work in proportion to its size.
pub fn module(functions: usize, body_bytes: usize) -> Vec<u8> {
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    section(1, &[1, 0x60, 0, 0], &mut module);
    let mut funcs = Vec::new();
    leb(functions, &mut funcs);
    funcs.extend(std::iter::repeat_n(0u8, functions));
    section(3, &funcs, &mut module);
    let step = [0x20, 0x00, 0x41, 0x01, 0x6a, 0x21, 0x00];
    let mut body = vec![1u8, 1, 0x7f]; // one local of type i32
    while body.len() + step.len() < body_bytes {
        body.extend_from_slice(&step);
    }
    body.push(0x0b);
    let mut code = Vec::new();
    leb(functions, &mut code);
    for _ in 0..functions {
        leb(body.len(), &mut code);
        code.extend_from_slice(&body);
    }
    section(10, &code, &mut module);
    module
}

/// `module` with a `name` section naming its function 0 in `bytes` bytes (`function`), or
/// the module itself (not `function`).
pub fn named(mut module: Vec<u8>, bytes: usize, function: bool) -> Vec<u8> {
    let mut names = Vec::new();
    if function {
        leb(1, &mut names); // one naming
        leb(0, &mut names); // of function 0
    }
    leb(bytes, &mut names);
    names.extend(std::iter::repeat_n(b'f', bytes));
    let mut body = Vec::new();
    leb(4, &mut body);
    body.extend_from_slice(b"name");
    // The function names subsection (1), or the module name subsection (0).
    section(u8::from(function), &names, &mut body);
    section(0, &body, &mut module);
    module
}

/// Guest `name`'s component with its `run` export lifted with string encoding `encoding`
/// (`1`: UTF-16, `2`: Latin-1+UTF-16) in place of the UTF-8 option `wit-component` writes:
/// the same bytes otherwise.
pub fn string_encoding(name: &str, encoding: u8) -> Vec<u8> {
    use wasmparser::{CanonicalFunction, Parser, Payload};
    let mut bytes = std::fs::read(guest(name)).expect("guest");
    let mut at = None;
    for payload in Parser::new(0).parse_all(&bytes) {
        if let Ok(Payload::ComponentCanonicalSection(reader)) = payload {
            for item in reader.into_iter_with_offsets() {
                let (offset, f) = item.expect("canonical function");
                if matches!(f, CanonicalFunction::Lift { .. }) {
                    at = Some(offset);
                }
            }
        }
    }
    // `canon lift`: 0x00 0x00, the core function, the options (a count, then each: 0x03 memory,
    // 0x04 realloc and 0x05 post-return take an index; 0x00 is UTF-8).
    let mut i = at.expect("a lift") + 2;
    let skip = |i: &mut usize, bytes: &[u8]| {
        while bytes[*i] & 0x80 != 0 {
            *i += 1;
        }
        *i += 1;
    };
    skip(&mut i, &bytes);
    let count = bytes[i];
    i += 1;
    for _ in 0..count {
        match bytes[i] {
            0x00 => {
                bytes[i] = encoding;
                return bytes;
            }
            0x03..=0x05 => {
                i += 1;
                skip(&mut i, &bytes);
            }
            _ => i += 1,
        }
    }
    panic!("{name}'s `run` has no UTF-8 option to replace");
}

/// A component made of these core modules and nothing else (no imports, no exports).
pub fn component(modules: &[Vec<u8>]) -> Vec<u8> {
    let mut component = b"\0asm\x0d\0\x01\0".to_vec();
    for m in modules {
        section(1, m, &mut component);
    }
    component
}

/// Guest `name`'s component with `modules` added: still a valid pushdown function, which costs
/// what the modules cost to check and compile.
pub fn guest_with(name: &str, modules: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = std::fs::read(guest(name)).expect("guest");
    for m in modules {
        section(1, m, &mut bytes);
    }
    bytes
}

/// Guest `name`'s component with a custom section naming `tag`: the same code, other bytes.
pub fn variant(name: &str, tag: &str) -> Vec<u8> {
    let mut bytes = std::fs::read(guest(name)).expect("guest");
    let mut payload = vec![tag.len() as u8];
    payload.extend_from_slice(tag.as_bytes());
    section(0, &payload, &mut bytes);
    bytes
}

/// Core modules defined at the top level of a component (its core module index space, which
/// `wit-component` fills with module sections only).
fn top_level_modules(component: &[u8]) -> usize {
    let (mut at, mut modules) = (8, 0);
    while at < component.len() {
        let id = component[at];
        at += 1;
        let (mut len, mut shift) = (0usize, 0);
        loop {
            let byte = component[at];
            at += 1;
            len |= usize::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                break;
            }
        }
        modules += usize::from(id == 1);
        at += len;
    }
    modules
}

/// Guest `name`'s component with core module `module` added and instantiated `times` times
/// (no imports): each instance holds what the module defines (a memory, a table) for as long
/// as the component instance lives.
pub fn instantiating(name: &str, module: &[u8], times: usize) -> Vec<u8> {
    let mut bytes = std::fs::read(guest(name)).expect("guest");
    let index = top_level_modules(&bytes);
    section(1, module, &mut bytes);
    section(2, &instantiations(index, times), &mut bytes); // a core instance section
    bytes
}

/// An instance section's body (core or component: the same bytes): `times` instantiations of
/// module or component `index`, with no arguments.
fn instantiations(index: usize, times: usize) -> Vec<u8> {
    let mut instances = Vec::new();
    leb(times, &mut instances);
    for _ in 0..times {
        instances.push(0x00); // instantiate
        leb(index, &mut instances);
        instances.push(0); // no arguments
    }
    instances
}

/// A core module defining one section's item: a memory of 0 pages (`5`), a table of 0
/// elements (`4`), or nothing at all (`None`).
pub fn defining(item: Option<u8>) -> Vec<u8> {
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    match item {
        Some(5) => section(5, &[1, 0x00, 0x00], &mut module),
        Some(4) => section(4, &[1, 0x70, 0x00, 0x00], &mut module),
        Some(other) => panic!("no item of section {other}"),
        None => {}
    }
    module
}

/// A core module with a table of no elements and a start function that grows it by `by`,
/// and traps (`unreachable`) if the growth is refused (`table.grow` answers -1).
pub fn growing_table(by: u32) -> Vec<u8> {
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    section(1, &[1, 0x60, 0, 0], &mut module); // type 0: () -> ()
    section(3, &[1, 0], &mut module); // function 0 of type 0
    section(4, &[1, 0x70, 0x00, 0x00], &mut module); // a funcref table, min 0, no max
    section(8, &[0], &mut module); // start: function 0
    let mut body = vec![0u8, 0xd0, 0x70, 0x41]; // no locals; ref.null func; i32.const
    let mut n = by;
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 && byte & 0x40 == 0 {
            body.push(byte);
            break;
        }
        body.push(byte | 0x80);
    }
    // table.grow 0; i32.const -1; i32.eq; if unreachable end; end
    body.extend_from_slice(&[
        0xfc, 0x0f, 0x00, 0x41, 0x7f, 0x46, 0x04, 0x40, 0x00, 0x0b, 0x0b,
    ]);
    let mut code = vec![1u8];
    leb(body.len(), &mut code);
    code.extend_from_slice(&body);
    section(10, &code, &mut module);
    module
}

/// A core module defining `memories` memories of no pages and `tables` funcref tables of
/// `table_elements` elements at their start.
pub fn defining_many(memories: usize, tables: usize, table_elements: usize) -> Vec<u8> {
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    if tables > 0 {
        let mut t = Vec::new();
        leb(tables, &mut t);
        for _ in 0..tables {
            t.extend_from_slice(&[0x70, 0x00]); // funcref, a minimum and no maximum
            leb(table_elements, &mut t);
        }
        section(4, &t, &mut module);
    }
    if memories > 0 {
        let mut m = Vec::new();
        leb(memories, &mut m);
        for _ in 0..memories {
            m.extend_from_slice(&[0x00, 0x00]); // no maximum, no pages
        }
        section(5, &m, &mut module);
    }
    module
}

/// A core module whose start function traps (`unreachable`), that function named `name` in the
/// module's `name` section.
pub fn trapping_named(name: &str) -> Vec<u8> {
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    section(1, &[1, 0x60, 0, 0], &mut module); // type 0: () -> ()
    section(3, &[1, 0], &mut module); // function 0 of type 0
    section(8, &[0], &mut module); // start: function 0
    section(10, &[1, 3, 0x00, 0x00, 0x0b], &mut module); // no locals; unreachable; end
    let mut names = Vec::new();
    leb(1, &mut names);
    leb(0, &mut names);
    leb(name.len(), &mut names);
    names.extend_from_slice(name.as_bytes());
    let mut body = Vec::new();
    leb(4, &mut body);
    body.extend_from_slice(b"name");
    section(1, &names, &mut body);
    section(0, &body, &mut module);
    module
}

/// Memories and tables the core modules of `component` define, all of them together.
pub fn memories_and_tables(component: &[u8]) -> (u32, u32) {
    use wasmparser::{Parser, Payload};
    let (mut memories, mut tables) = (0, 0);
    for payload in Parser::new(0).parse_all(component) {
        match payload.expect("valid") {
            Payload::MemorySection(r) => memories += r.count(),
            Payload::TableSection(r) => tables += r.count(),
            _ => {}
        }
    }
    (memories, tables)
}

/// A core module importing `n` functions `() -> ()` (module `m`, names `f0`, `f1`...).
pub fn importing(n: usize) -> Vec<u8> {
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    section(1, &[1, 0x60, 0, 0], &mut module); // type 0: () -> ()
    let mut imports = Vec::new();
    leb(n, &mut imports);
    for i in 0..n {
        let name = format!("f{i}");
        imports.extend_from_slice(&[1, b'm']);
        leb(name.len(), &mut imports);
        imports.extend_from_slice(name.as_bytes());
        imports.extend_from_slice(&[0x00, 0x00]); // a function of type 0
    }
    section(2, &imports, &mut module);
    module
}

/// Imports of a component and of its core modules together, as the host counts them.
pub fn imports_of(component: &[u8]) -> u32 {
    use wasmparser::{Parser, Payload};
    let mut imports = 0;
    for payload in Parser::new(0).parse_all(component) {
        match payload.expect("valid") {
            Payload::ImportSection(r) => imports += r.count(),
            Payload::ComponentImportSection(r) => imports += r.count(),
            _ => {}
        }
    }
    imports
}

/// A core module declaring `n` function types `() -> ()`.
pub fn typing(n: usize) -> Vec<u8> {
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    let mut types = Vec::new();
    leb(n, &mut types);
    for _ in 0..n {
        types.extend_from_slice(&[0x60, 0, 0]);
    }
    section(1, &types, &mut module);
    module
}

/// Guest `name`'s component with a type section added: one instance type of `n` declarations,
/// each a type `bool`.
pub fn declaring(name: &str, n: usize) -> Vec<u8> {
    let mut bytes = std::fs::read(guest(name)).expect("guest");
    let mut types = vec![1u8, 0x42]; // one type: an instance type
    leb(n, &mut types);
    for _ in 0..n {
        types.extend_from_slice(&[0x01, 0x7f]); // type: bool
    }
    section(7, &types, &mut bytes);
    bytes
}

/// Guest `name`'s component instantiating, once, a chain of `levels` nested components, each
/// instantiating the one nested in it `fan` times (the innermost empty): `fan^levels`
/// instances from about `3 * fan * levels` bytes.
pub fn instantiating_nested(name: &str, levels: usize, fan: usize) -> Vec<u8> {
    let header = b"\0asm\x0d\0\x01\0";
    let mut nested = header.to_vec();
    for _ in 0..levels {
        let mut next = header.to_vec();
        section(4, &nested, &mut next); // a component section: the one below
        let mut instances = Vec::new();
        leb(fan, &mut instances);
        for _ in 0..fan {
            instances.extend_from_slice(&[0, 0, 0]); // instantiate component 0, no arguments
        }
        section(5, &instances, &mut next); // a component instance section
        nested = next;
    }
    instantiated(name, &nested, 1)
}

/// Guest `name`'s component instantiating, `times` times, a nested component of `n` types.
pub fn instantiating_types(name: &str, n: usize, times: usize) -> Vec<u8> {
    let mut nested = b"\0asm\x0d\0\x01\0".to_vec();
    let mut types = Vec::new();
    leb(n, &mut types);
    types.extend(std::iter::repeat_n(0x7fu8, n)); // each a type `bool`
    section(7, &types, &mut nested);
    instantiated(name, &nested, times)
}

/// Guest `name`'s component with `nested` defined in it and instantiated `times` times.
fn instantiated(name: &str, nested: &[u8], times: usize) -> Vec<u8> {
    let mut bytes = std::fs::read(guest(name)).expect("guest");
    // The guest's components before it, in its index space of components.
    let index = wasmparser::Parser::new(0)
        .parse_all(&bytes)
        .try_fold((0usize, 0usize), |(depth, n), p| {
            p.map(|p| match p {
                wasmparser::Payload::ComponentSection { .. } if depth == 0 => (depth + 1, n + 1),
                wasmparser::Payload::ModuleSection { .. }
                | wasmparser::Payload::ComponentSection { .. } => (depth + 1, n),
                wasmparser::Payload::End(_) => (depth.saturating_sub(1), n),
                _ => (depth, n),
            })
        })
        .expect("guest parses")
        .1;
    section(4, nested, &mut bytes);
    section(5, &instantiations(index, times), &mut bytes); // a component instance section
    bytes
}

/// A core module whose types are one recursion group (the GC proposal's `rec`) of `n`
/// function types `() -> ()`: one item of its type section.
pub fn rec_typing(n: usize) -> Vec<u8> {
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    let mut types = vec![1u8, 0x4e];
    leb(n, &mut types);
    for _ in 0..n {
        types.extend_from_slice(&[0x60, 0, 0]);
    }
    section(1, &types, &mut module);
    module
}

/// Guest `name`'s component with a nested component that imports a component and
/// instantiates it: what instantiating it inlines depends on what its instantiator passes in.
pub fn instantiating_an_import(name: &str) -> Vec<u8> {
    let mut nested = b"\0asm\x0d\0\x01\0".to_vec();
    section(7, &[1, 0x41, 0], &mut nested); // type 0: a component type of no declarations
    section(10, &[1, 0, 1, b'c', 0x04, 0], &mut nested); // import `c`: a component of type 0
    section(5, &[1, 0, 0, 0], &mut nested); // instantiate component 0, no arguments
    let mut bytes = std::fs::read(guest(name)).expect("guest");
    section(4, &nested, &mut bytes);
    bytes
}

/// Guest `name`'s component with a type section added: one component type nesting `depth`
/// component types, each declaring the next (three bytes a level).
pub fn nesting_types(name: &str, depth: usize) -> Vec<u8> {
    let mut types = vec![1u8]; // one type
    for _ in 1..depth {
        types.extend_from_slice(&[0x41, 0x01, 0x01]); // a component type declaring a type:
    }
    types.extend_from_slice(&[0x41, 0x00]); // the innermost, declaring nothing
    let mut bytes = std::fs::read(guest(name)).expect("guest");
    section(7, &types, &mut bytes);
    bytes
}

/// Guest `name`'s component with an instance of exports added, exporting the component's
/// instance 0 (the first interface it imports) as `a`.
pub fn exporting_an_instance(name: &str) -> Vec<u8> {
    let mut bytes = std::fs::read(guest(name)).expect("guest");
    // One instance: from exports, one export: plain name `a`, an instance, index 0.
    section(5, &[1, 0x01, 1, 0x00, 1, b'a', 0x05, 0], &mut bytes);
    bytes
}
