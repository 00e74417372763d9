//! A tenant's component, checked before it is compiled.
//!
//! Compiling costs the host time and memory that grow with the code (cranelift on one huge
//! function takes seconds and hundreds of MiB), so everything that can be checked without
//! compiling is checked first: in one linear pass of the same parser wasmtime uses, that the
//! bytes are a component whose code and imports stay within named bounds; then that they
//! validate, import only interfaces the tenant is granted, and export `run`. Only then is the
//! component compiled (see `functions` for the queue that does it off the request path).

use crate::account::text::quote;
use wasmparser::{Encoding, Parser, Payload, Validator, WasmFeatures};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Largest function body. Rust release builds of real pushdown functions stay far below
/// (the largest in `feature-extract`, an image decoder's, is about 60 KiB); cranelift's time and
/// memory grow faster than linearly with a body's size.
pub const MAX_FUNCTION_BODY: usize = 512 << 10;
/// Most code bytes (all function bodies) in one component.
pub const MAX_CODE_BYTES: usize = 8 << 20;
/// Most functions in one component.
pub const MAX_FUNCTIONS: usize = 50_000;
/// Most core modules and nested components in one component.
pub const MAX_MODULES: usize = 64;
/// Longest module or function name in a core module's `name` section. Wasmtime copies a frame's
/// module and function names into every trap's backtrace (up to 20 frames, a time or memory limit's stop included),
/// and the error message is formatted from it: a 25 MiB name in a function that recursed 20
/// deep would cost the host about 1 GiB per trap, charged to no one. Rust's longest names in
/// our guests are a few hundred bytes.
pub const MAX_FUNCTION_NAME: usize = 4096;
/// Most imports, of the component and of its core modules together. Our guests import a few
/// dozen interfaces and functions; wasmparser allows a million per section.
pub const MAX_IMPORTS: u32 = 10_000;
/// Most items all of a component's sections declare together (types, imports, functions,
/// tables, memories, globals, exports, elements, data, instances, aliases..., and the
/// declarations inside component, instance and module types; a function is counted in its
/// module's function section and again in its code section), counted before the validator
/// builds its tables for them. Our largest guest declares a few thousand.
pub const MAX_ITEMS: u32 = 150_000;
/// Deepest nesting of component and instance types inside one another (a WIT world's type
/// nests three or four deep). The parser reads a nested type by recursion, as does the count
/// of its declarations: three bytes a level, and 1,000 levels (in a debug build; a few more in
/// a release one) overflowed the compile thread's stack, which aborts the whole host.
pub const MAX_TYPE_DEPTH: usize = 32;
/// Most denied imports an error names, and how many more there were.
const DENIED_NAMED: usize = 8;
/// Most memories and tables defined by all of a component's core modules together (whether
/// instantiated or not: wasmtime prepares every module's memory and table images when it
/// compiles, before the pool's per-component bounds are checked), and the bound on a table's
/// initial size: the pool's own bounds (`wasm::engine`).
pub const MAX_MEMORIES: u32 = crate::wasm::engine::MAX_MEMORIES_PER_COMPONENT;
pub const MAX_TABLES: u32 = crate::wasm::engine::MAX_TABLES_PER_COMPONENT;

/// Why a component cannot be deployed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeployError {
    #[error("not WebAssembly (no `\\0asm` header)")]
    NotWasm,
    #[error(
        "a core Wasm module, not a component: build with `cargo build --target wasm32-wasip2` or `cargo component build`"
    )]
    CoreModule,
    #[error("does not validate: {0}")]
    Invalid(String),
    #[error("too large to compile: {0}")]
    TooComplex(String),
    #[error("imports interfaces tenant `{tenant}` is not granted: {imports}")]
    NotGranted { tenant: String, imports: String },
    #[error("does not implement the `hapi:pushdown/pushdown` world: {0}")]
    WrongWorld(String),
}

/// What the check learnt about a component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub imports: Vec<String>,
    /// Core modules and nested components.
    pub modules: usize,
    pub functions: usize,
    pub code_bytes: usize,
    pub largest_body: usize,
}

/// Checks `bytes` without compiling them: a valid component within the code bounds, importing
/// only names that start with one of `allowed`, exporting `run`.
pub fn check(bytes: &[u8], tenant: &str, allowed: &[&str]) -> Result<Checked, DeployError> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(DeployError::NotWasm);
    }
    if bytes[4..8] == [1, 0, 0, 0] {
        return Err(DeployError::CoreModule);
    }
    // The bounds first, in a pass that keeps nothing but counts and the component's import
    // names, then the validator, whose tables grow with what it validates: validating first
    // built its tables for a million imports (and the host quoted every denied name in the
    // error) before any bound applied, on a compile thread, charged to no one.
    let mut info = Checked {
        imports: Vec::new(),
        modules: 0,
        functions: 0,
        code_bytes: 0,
        largest_body: 0,
    };
    let (mut depth, mut exports_run) = (0i64, false);
    let (mut memories, mut tables, mut imports) = (0u32, 0u32, 0u32);
    let too = |what: String| Err(DeployError::TooComplex(what));
    let mut items = 0u32;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| DeployError::Invalid(e.to_string()))?;
        if let Payload::ComponentTypeSection(r) = &payload {
            types_nest_within(bytes, r.range())?;
        }
        items = items
            .saturating_add(section_items(&payload))
            .saturating_add(declared_items(&payload)?)
            .saturating_add(instance_items(&payload)?);
        if items > MAX_ITEMS {
            return too(format!(
                "more than {MAX_ITEMS} items (types, imports, functions, exports...) in its sections"
            ));
        }
        match payload {
            Payload::Version { encoding, .. } if depth == 0 && encoding != Encoding::Component => {
                return Err(DeployError::CoreModule);
            }
            // A nested component (a composition): wasmtime's compile inlines every
            // instantiation of one anew, with copies of what it closes over and of the
            // instances it passes around, at costs that grow faster than the upload (nested
            // instantiations in a 92 KB upload made 8 million instances, 2.2 GB, before
            // cranelift panicked; outer aliases copied twice double at each level). No
            // toolchain for pushdown functions makes one.
            Payload::ComponentSection { .. } => {
                return too(
                    "it nests components (a composition): build the function as one component, \
                     as cargo component and the wasm32-wasip2 target do"
                        .into(),
                );
            }
            Payload::ModuleSection { .. } => {
                depth += 1;
                info.modules += 1;
                if info.modules > MAX_MODULES {
                    return too(format!("more than {MAX_MODULES} modules and components"));
                }
            }
            Payload::End(_) => depth -= 1,
            Payload::ComponentImportSection(reader) => {
                imports = imports.saturating_add(reader.count());
                if imports > MAX_IMPORTS {
                    return too(format!("more than {MAX_IMPORTS} imports"));
                }
                if depth > 0 {
                    continue;
                }
                for import in reader {
                    let import = import.map_err(|e| DeployError::Invalid(e.to_string()))?;
                    // Types a world `use`s are imported by name too; they grant nothing.
                    if !matches!(import.ty, wasmparser::ComponentTypeRef::Type(_)) {
                        info.imports.push(import.name.name.to_string());
                    }
                }
            }
            Payload::ComponentExportSection(reader) if depth == 0 => {
                for export in reader {
                    let export = export.map_err(|e| DeployError::Invalid(e.to_string()))?;
                    exports_run |= export.name.name == "run";
                }
            }
            Payload::ComponentCanonicalSection(reader) => {
                for function in reader {
                    let function = function.map_err(|e| DeployError::Invalid(e.to_string()))?;
                    utf8_only(&function)?;
                }
            }
            Payload::ImportSection(reader) => {
                imports = imports.saturating_add(reader.count());
                if imports > MAX_IMPORTS {
                    return too(format!("more than {MAX_IMPORTS} imports"));
                }
            }
            Payload::MemorySection(reader) => {
                memories = memories.saturating_add(reader.count());
                if memories > MAX_MEMORIES {
                    return too(format!(
                        "more than {MAX_MEMORIES} memories defined by its modules"
                    ));
                }
            }
            Payload::TableSection(reader) => {
                tables = tables.saturating_add(reader.count());
                if tables > MAX_TABLES {
                    return too(format!(
                        "more than {MAX_TABLES} tables defined by its modules"
                    ));
                }
                for table in reader {
                    let table = table.map_err(|e| DeployError::Invalid(e.to_string()))?;
                    let max = crate::wasm::engine::MAX_TABLE_ELEMENTS as u64;
                    if table.ty.initial > max {
                        return too(format!(
                            "a table of {} elements at its start; at most {max}",
                            table.ty.initial
                        ));
                    }
                }
            }
            Payload::CustomSection(section) if section.name() == "name" => {
                names_within_bound(&section)?;
            }
            Payload::CodeSectionEntry(body) => {
                let size = body.range().len();
                info.functions += 1;
                info.code_bytes += size;
                info.largest_body = info.largest_body.max(size);
                if size > MAX_FUNCTION_BODY {
                    return too(format!(
                        "a function body of {size} bytes; at most {MAX_FUNCTION_BODY}"
                    ));
                }
                if info.code_bytes > MAX_CODE_BYTES {
                    return too(format!("more than {MAX_CODE_BYTES} bytes of code"));
                }
                if info.functions > MAX_FUNCTIONS {
                    return too(format!("more than {MAX_FUNCTIONS} functions"));
                }
            }
            _ => {}
        }
    }
    // Without the GC proposal's explicit recursion groups (no toolchain for pushdown functions
    // emits them): a group of a million types counted as one item in the bounds above, and the
    // validator built its tables for 21 million from one upload.
    let mut validator = Validator::new_with_features(WasmFeatures::default() - WasmFeatures::GC);
    // The validator asserts some of its own limits (an instance type nested past 127 levels
    // through indexes): a panic is this upload's refusal, not the compile worker's fault.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        validator.validate_all(bytes)
    }))
    .map_err(|panic| {
        DeployError::Invalid(format!(
            "the validator stopped: {}",
            crate::account::text::panic_message(panic.as_ref())
        ))
    })?
    .map_err(|e| DeployError::Invalid(e.to_string()))?;
    // Built against another version of the world: its imports and `run` do not match this
    // host's, which the linker would only say one name at a time. Looked at before the grants:
    // an old component's other imports may be ones the tenant is not granted, and rebuilding is
    // what it needs first.
    if let Some((name, version)) = info.imports.iter().find_map(|name| {
        let rest = name.strip_prefix("hapi:pushdown/")?;
        let version = rest.split_once('@').map(|(_, v)| v);
        (!version.is_some_and(world_compatible)).then_some((name, version))
    }) {
        let built = match version {
            Some(v) => format!("hapi:pushdown@{}", quote(v)),
            None => "an unversioned hapi:pushdown".into(),
        };
        return Err(DeployError::WrongWorld(format!(
            "it was built against {built} (it imports `{}`), and this host implements \
             hapi:pushdown@{WORLD_VERSION}: rebuild it against this host's `wit/`",
            quote(name)
        )));
    }
    let denied: Vec<&String> = info
        .imports
        .iter()
        .filter(|name| !allowed.iter().any(|p| name.starts_with(p)))
        .collect();
    if !denied.is_empty() {
        let mut named: Vec<String> = denied.iter().take(DENIED_NAMED).map(|n| quote(n)).collect();
        if denied.len() > DENIED_NAMED {
            named.push(format!("and {} more", denied.len() - DENIED_NAMED));
        }
        return Err(DeployError::NotGranted {
            tenant: tenant.to_string(),
            imports: named.join(", "),
        });
    }
    if !exports_run {
        return Err(DeployError::WrongWorld(
            "it exports no `run` function".into(),
        ));
    }
    Ok(info)
}

/// The version of the `hapi:pushdown` package (`wit/pushdown.wit`) this host implements.
pub const WORLD_VERSION: &str = "0.2.0";

/// Whether a component's `hapi:pushdown` import `version` links with [`WORLD_VERSION`], as
/// wasmtime's linker matches semver: the same major version (for 0.x, the same minor), build
/// metadata ignored; a prerelease only as itself.
fn world_compatible(version: &str) -> bool {
    let parse = |v: &str| -> Option<(u64, u64, u64, bool)> {
        let v = v.split_once('+').map_or(v, |(v, _)| v);
        let (v, pre) = v.split_once('-').map_or((v, false), |(v, _)| (v, true));
        let mut parts = v.split('.').map(|p| p.parse::<u64>().ok());
        let (major, minor, patch) = (parts.next()??, parts.next()??, parts.next()??);
        parts.next().is_none().then_some((major, minor, patch, pre))
    };
    match (parse(version), parse(WORLD_VERSION)) {
        (Some((major, minor, _, false)), Some((our_major, our_minor, _, false))) => {
            major == our_major && (major != 0 || minor == our_minor)
        }
        (Some(_), _) => version == WORLD_VERSION,
        (None, _) => false,
    }
}

/// The component-level instances a section makes, checked and counted: items for the
/// arguments and exports they name (wasmtime's compile copies each), beyond the section's
/// count. A component instantiates no component (with none nested, only one it imports, or
/// takes from an instance, could be: any its instantiator passes in), and an instance of
/// exports holds no instance or component: each use of such an instance copies all it holds,
/// and instances holding two of the one before double at each level.
fn instance_items(payload: &Payload<'_>) -> Result<u32, DeployError> {
    use wasmparser::{ComponentExternalKind as Kind, ComponentInstance, Instance};
    let invalid = |e: wasmparser::BinaryReaderError| DeployError::Invalid(e.to_string());
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let mut n = 0u32;
    match payload {
        Payload::InstanceSection(reader) => {
            for instance in reader.clone() {
                n = n.saturating_add(match instance.map_err(invalid)? {
                    Instance::Instantiate { args, .. } => count(args.len()),
                    Instance::FromExports(exports) => count(exports.len()),
                });
            }
        }
        Payload::ComponentInstanceSection(reader) => {
            for instance in reader.clone() {
                match instance.map_err(invalid)? {
                    ComponentInstance::Instantiate {
                        component_index, ..
                    } => {
                        return Err(DeployError::TooComplex(format!(
                            "it instantiates component {component_index}, which it imports or \
                             takes from an instance: what compiling it inlines would be what \
                             its instantiator passes in"
                        )));
                    }
                    ComponentInstance::FromExports(exports) => {
                        if exports
                            .iter()
                            .any(|e| matches!(e.kind, Kind::Instance | Kind::Component))
                        {
                            return Err(DeployError::TooComplex(
                                "an instance of its exports exports an instance or a component \
                                 (each use of it is compiled as a copy of all it holds)"
                                    .into(),
                            ));
                        }
                        n = n.saturating_add(count(exports.len()));
                    }
                }
            }
        }
        _ => {}
    }
    Ok(n)
}

/// Checks, without recursion, that the component and instance types of the type section at
/// `range` of `bytes` nest at most [`MAX_TYPE_DEPTH`] deep: the declarations of each open one
/// are read in turn, a nested one opening a level, everything else read (and dropped) by the
/// parser, which recurses only into those two.
fn types_nest_within(bytes: &[u8], range: std::ops::Range<usize>) -> Result<(), DeployError> {
    use wasmparser::{
        BinaryReader, ComponentAlias, ComponentExternName, ComponentImport, ComponentType,
        ComponentTypeRef, CoreType,
    };
    let invalid = |e: wasmparser::BinaryReaderError| DeployError::Invalid(e.to_string());
    let section = bytes.get(range.clone()).ok_or_else(|| {
        DeployError::Invalid(format!(
            "a type section past the end, at byte {}",
            range.start
        ))
    })?;
    let mut reader = BinaryReader::new(section, range.start);
    // A type where one may be: a component or instance type opens a level (its declarations
    // still to read, pushed on `open`); any other is read whole.
    let ty = |reader: &mut BinaryReader<'_>, open: &mut Vec<u32>| -> Result<(), DeployError> {
        match reader.clone().read_u8().map_err(invalid)? {
            0x41 | 0x42 => {
                reader.read_u8().map_err(invalid)?;
                open.push(reader.read_var_u32().map_err(invalid)?);
                if open.len() > MAX_TYPE_DEPTH {
                    return Err(DeployError::TooComplex(format!(
                        "component or instance types nested more than {MAX_TYPE_DEPTH} deep"
                    )));
                }
            }
            _ => {
                reader.read::<ComponentType<'_>>().map_err(invalid)?;
            }
        }
        Ok(())
    };
    let mut types = reader.read_var_u32().map_err(invalid)?;
    let mut open: Vec<u32> = Vec::new();
    loop {
        match open.last_mut() {
            Some(0) => {
                open.pop();
            }
            Some(decls) => {
                *decls -= 1;
                match reader.read_u8().map_err(invalid)? {
                    0x00 => {
                        reader.read::<CoreType<'_>>().map_err(invalid)?;
                    }
                    0x01 => ty(&mut reader, &mut open)?,
                    0x02 => {
                        reader.read::<ComponentAlias<'_>>().map_err(invalid)?;
                    }
                    0x03 => {
                        reader.read::<ComponentImport<'_>>().map_err(invalid)?;
                    }
                    0x04 => {
                        reader.read::<ComponentExternName<'_>>().map_err(invalid)?;
                        reader.read::<ComponentTypeRef>().map_err(invalid)?;
                    }
                    b => {
                        return Err(DeployError::Invalid(format!(
                            "a type declaration of kind {b:#04x} at byte {}",
                            reader.original_position() - 1
                        )));
                    }
                }
            }
            None if types == 0 => return Ok(()),
            None => {
                types -= 1;
                ty(&mut reader, &mut open)?;
            }
        }
    }
}

/// Items a section declares (its count, read without reading them), 0 for other payloads.
fn section_items(payload: &Payload<'_>) -> u32 {
    match payload {
        Payload::TypeSection(r) => r.count(),
        Payload::ImportSection(r) => r.count(),
        Payload::FunctionSection(r) => r.count(),
        Payload::TableSection(r) => r.count(),
        Payload::MemorySection(r) => r.count(),
        Payload::TagSection(r) => r.count(),
        Payload::GlobalSection(r) => r.count(),
        Payload::ExportSection(r) => r.count(),
        Payload::ElementSection(r) => r.count(),
        Payload::DataSection(r) => r.count(),
        Payload::CodeSectionStart { count, .. } => *count,
        Payload::InstanceSection(r) => r.count(),
        Payload::CoreTypeSection(r) => r.count(),
        Payload::ComponentInstanceSection(r) => r.count(),
        Payload::ComponentAliasSection(r) => r.count(),
        Payload::ComponentTypeSection(r) => r.count(),
        Payload::ComponentCanonicalSection(r) => r.count(),
        Payload::ComponentImportSection(r) => r.count(),
        Payload::ComponentExportSection(r) => r.count(),
        _ => 0,
    }
}

/// Declarations inside a type section's component, instance and module types (an instance
/// type's exports, say), nested ones included: one type may hold a million, each a table
/// entry for the validator. Each type is read (and dropped) on its own, so this pass holds one
/// at a time.
fn declared_items(payload: &Payload<'_>) -> Result<u32, DeployError> {
    let invalid = |e: wasmparser::BinaryReaderError| DeployError::Invalid(e.to_string());
    let mut n = 0u32;
    match payload {
        Payload::ComponentTypeSection(r) => {
            for ty in r.clone() {
                n = n.saturating_add(component_type_items(&ty.map_err(invalid)?));
            }
        }
        Payload::CoreTypeSection(r) => {
            for ty in r.clone() {
                n = n.saturating_add(core_type_items(&ty.map_err(invalid)?));
            }
        }
        _ => {}
    }
    Ok(n)
}

fn component_type_items(ty: &wasmparser::ComponentType<'_>) -> u32 {
    use wasmparser::{ComponentType, ComponentTypeDeclaration, InstanceTypeDeclaration};
    let count = |len: usize| u32::try_from(len).unwrap_or(u32::MAX);
    match ty {
        ComponentType::Component(decls) => decls.iter().fold(count(decls.len()), |n, d| {
            n.saturating_add(match d {
                ComponentTypeDeclaration::CoreType(c) => core_type_items(c),
                ComponentTypeDeclaration::Type(t) => component_type_items(t),
                _ => 0,
            })
        }),
        ComponentType::Instance(decls) => decls.iter().fold(count(decls.len()), |n, d| {
            n.saturating_add(match d {
                InstanceTypeDeclaration::CoreType(c) => core_type_items(c),
                InstanceTypeDeclaration::Type(t) => component_type_items(t),
                _ => 0,
            })
        }),
        _ => 0,
    }
}

fn core_type_items(ty: &wasmparser::CoreType<'_>) -> u32 {
    match ty {
        wasmparser::CoreType::Module(decls) => u32::try_from(decls.len()).unwrap_or(u32::MAX),
        // The types of a recursion group, one item each (the section counted the group).
        wasmparser::CoreType::Rec(group) => {
            u32::try_from(group.types().len().saturating_sub(1)).unwrap_or(u32::MAX)
        }
    }
}

/// Refuses a canonical function whose strings are UTF-16 or Latin-1 in the guest's memory: the
/// host lifts them into UTF-8 strings of up to twice (Latin-1) or one and a half times (UTF-16)
/// the guest's bytes, beyond the lifting cap (the tenant's memory limit, counted in the guest's
/// bytes), and an error string is formatted again from that. Rust, C, Go, Python and
/// JavaScript toolchains for components use UTF-8.
fn utf8_only(function: &wasmparser::CanonicalFunction) -> Result<(), DeployError> {
    use wasmparser::{CanonicalFunction as F, CanonicalOption as O};
    let options = match function {
        F::Lift { options, .. }
        | F::Lower { options, .. }
        | F::TaskReturn { options, .. }
        | F::StreamRead { options, .. }
        | F::StreamWrite { options, .. }
        | F::FutureRead { options, .. }
        | F::FutureWrite { options, .. }
        | F::ErrorContextNew { options, .. }
        | F::ErrorContextDebugMessage { options, .. } => options,
        _ => return Ok(()),
    };
    match options
        .iter()
        .find(|o| matches!(o, O::UTF16 | O::CompactUTF16))
    {
        Some(o) => Err(DeployError::Invalid(format!(
            "a canonical function's strings are {}; the host takes UTF-8 strings only",
            if matches!(o, O::UTF16) {
                "UTF-16"
            } else {
                "Latin-1 or UTF-16 (`latin1+utf16`)"
            }
        ))),
        None => Ok(()),
    }
}

/// Refuses a core module's `name` section naming the module or a function in more than
/// [`MAX_FUNCTION_NAME`] bytes, or one that does not parse (wasmtime would skip what it cannot
/// read; this check may not).
fn names_within_bound(section: &wasmparser::CustomSectionReader<'_>) -> Result<(), DeployError> {
    let wasmparser::KnownCustom::Name(names) = section.as_known() else {
        return Ok(());
    };
    let bad = |e: wasmparser::BinaryReaderError| {
        DeployError::Invalid(format!("its `name` section does not parse: {e}"))
    };
    let too_long = |what: String, len: usize| {
        DeployError::TooComplex(format!(
            "{what} is named in {len} bytes; at most {MAX_FUNCTION_NAME} (its name is copied \
             into every trap's backtrace)"
        ))
    };
    for subsection in names {
        match subsection.map_err(bad)? {
            wasmparser::Name::Module { name, .. } if name.len() > MAX_FUNCTION_NAME => {
                return Err(too_long("a module".into(), name.len()));
            }
            wasmparser::Name::Function(functions) => {
                for naming in functions {
                    let naming = naming.map_err(bad)?;
                    if naming.name.len() > MAX_FUNCTION_NAME {
                        let what = format!("function {}", naming.index);
                        return Err(too_long(what, naming.name.len()));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Compiles checked bytes.
pub fn compile(engine: &Engine, bytes: &[u8]) -> Result<Component, DeployError> {
    // A panic in the compiler (a cranelift assertion on a shape of code the check let through)
    // is this upload's refusal, charged to its tenant as a failed compile is.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Component::new(engine, bytes)
    }))
    .map_err(|panic| {
        DeployError::Invalid(format!(
            "the compiler stopped: {}",
            crate::account::text::panic_message(panic.as_ref())
        ))
    })?
    .map_err(|e| DeployError::Invalid(crate::account::text::bounded_display(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_that_are_not_components_are_named() {
        assert_eq!(check(b"hello", "t", &[]), Err(DeployError::NotWasm));
        assert_eq!(
            check(b"\0asm\x01\0\0\0", "t", &[]),
            Err(DeployError::CoreModule)
        );
        assert!(matches!(
            check(b"\0asm\x0d\0\x01\0garbage", "t", &[]),
            Err(DeployError::Invalid(_))
        ));
    }

    #[test]
    fn world_versions_link_as_wasmtime_matches_semver() {
        assert_eq!(WORLD_VERSION, "0.2.0", "the cases below are for 0.2.0");
        for ok in ["0.2.0", "0.2.1", "0.2.7+build.5"] {
            assert!(world_compatible(ok), "{ok}");
        }
        for bad in [
            "0.1.0",
            "0.3.0",
            "1.2.0",
            "0.2.0-rc1",
            "0.2",
            "0.2.0.1",
            "x.y.z",
            "",
        ] {
            assert!(!world_compatible(bad), "{bad}");
        }
    }
}
