//! Reads a crate's files into a module tree: which modules exist, in which file each one
//! lives, what each defines and imports, and every path each file writes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use syn::spanned::Spanned;
use syn::visit::Visit;

/// Index of a module in [`ModuleTree::modules`].
pub type ModuleId = usize;

/// A path written in a module, as segments (`crate`, `super`, `self` kept as written).
#[derive(Debug, Clone)]
pub struct WrittenPath {
    /// The module whose scope the path is read in.
    pub module: ModuleId,
    /// The segments, e.g. `["crate", "node", "NodeInner"]`.
    pub segments: Vec<String>,
    /// Line of the path in its file (1-based).
    pub line: usize,
}

/// One module: a file, or an inline `mod x { ... }` inside a file.
#[derive(Debug, Default)]
pub struct Module {
    /// Index into [`ModuleTree::files`] of the file the module's items are written in.
    pub file: usize,
    /// The enclosing module; `None` for the crate root.
    pub parent: Option<ModuleId>,
    /// Child modules by name.
    pub children: BTreeMap<String, ModuleId>,
    /// Names of the items the module defines (types, functions, traits, consts, ...).
    pub items: std::collections::BTreeSet<String>,
    /// Names the module's `use` declarations bring in, and the path each one names.
    pub imports: BTreeMap<String, WrittenPath>,
    /// The modules or types whose names `use x::*` brings in.
    pub globs: Vec<WrittenPath>,
    /// The folder the module's `mod y;` children are looked for in.
    dir: PathBuf,
}

/// A crate's module tree and the paths its files write.
#[derive(Debug)]
pub struct ModuleTree {
    /// Every source file, the root first.
    pub files: Vec<PathBuf>,
    /// Every module; the crate root is module 0.
    pub modules: Vec<Module>,
    /// Every path written in code and in `use` declarations, outside test-only code.
    pub references: Vec<WrittenPath>,
}

impl ModuleTree {
    /// Reads the crate rooted at `root` (its `lib.rs` or `main.rs`) and every file its
    /// `mod` declarations reach.
    pub fn read(root: &Path) -> anyhow::Result<ModuleTree> {
        let dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
        let mut tree = ModuleTree {
            files: Vec::new(),
            modules: Vec::new(),
            references: Vec::new(),
        };
        tree.modules.push(Module {
            dir,
            ..Module::default()
        });
        tree.read_file(root, 0)?;
        Ok(tree)
    }

    fn read_file(&mut self, path: &Path, module: ModuleId) -> anyhow::Result<()> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let file = syn::parse_file(&text).map_err(|e| {
            let at = e.span().start();
            anyhow::anyhow!(
                "{}:{}:{}: not Rust that syn can parse: {e}",
                path.display(),
                at.line,
                at.column + 1
            )
        })?;
        self.files.push(path.to_path_buf());
        self.modules[module].file = self.files.len() - 1;
        self.read_items(&file.items, module, path)
    }

    fn read_items(&mut self, items: &[syn::Item], module: ModuleId, file: &Path) -> anyhow::Result<()> {
        for item in items {
            if is_test_only(item_attrs(item)) {
                continue;
            }
            match item {
                syn::Item::Mod(m) => self.read_mod(m, module, file)?,
                syn::Item::Use(u) => self.read_use(&u.tree, Vec::new(), module),
                other => {
                    if let Some(name) = item_name(other) {
                        let target = if is_exported_macro(other) { 0 } else { module };
                        self.modules[target].items.insert(name);
                    }
                    let mut collector = PathCollector {
                        module,
                        found: &mut self.references,
                    };
                    collector.visit_item(other);
                }
            }
        }
        Ok(())
    }

    fn read_mod(&mut self, m: &syn::ItemMod, parent: ModuleId, file: &Path) -> anyhow::Result<()> {
        let name = m.ident.to_string();
        let parent_dir = self.modules[parent].dir.clone();
        let child = self.modules.len();
        self.modules.push(Module {
            parent: Some(parent),
            dir: parent_dir.join(&name),
            ..Module::default()
        });
        self.modules[parent].children.insert(name.clone(), child);
        if let Some((_, items)) = &m.content {
            self.modules[child].file = self.modules[parent].file;
            return self.read_items(items, child, file);
        }
        let child_file = match path_attribute(&m.attrs) {
            Some(explicit) => {
                let base = file.parent().unwrap_or(Path::new("."));
                base.join(explicit)
            }
            None => {
                let flat = parent_dir.join(format!("{name}.rs"));
                let nested = parent_dir.join(&name).join("mod.rs");
                if flat.is_file() {
                    flat
                } else if nested.is_file() {
                    nested
                } else {
                    bail!(
                        "{}: `mod {name};` but neither {} nor {} exists",
                        file.display(),
                        flat.display(),
                        nested.display()
                    );
                }
            }
        };
        // A `foo/mod.rs` (or a `#[path]` file) keeps its children beside it; `foo.rs` keeps
        // them in `foo/`.
        if child_file.file_name().is_some_and(|n| n == "mod.rs") || path_attribute(&m.attrs).is_some() {
            self.modules[child].dir = child_file.parent().unwrap_or(Path::new(".")).to_path_buf();
        }
        self.read_file(&child_file, child)
    }

    fn read_use(&mut self, tree: &syn::UseTree, mut prefix: Vec<String>, module: ModuleId) {
        let line = tree.span().start().line;
        let written = |segments: Vec<String>| WrittenPath { module, segments, line };
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.read_use(&p.tree, prefix, module);
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                if name == "self" {
                    if let Some(last) = prefix.last().cloned() {
                        self.add_import(module, last, written(prefix));
                    }
                } else {
                    prefix.push(name.clone());
                    self.add_import(module, name, written(prefix));
                }
            }
            syn::UseTree::Rename(r) => {
                let name = r.ident.to_string();
                if name != "self" {
                    prefix.push(name);
                }
                let alias = r.rename.to_string();
                let path = written(prefix);
                if alias == "_" {
                    self.references.push(path);
                } else {
                    self.add_import(module, alias, path);
                }
            }
            syn::UseTree::Glob(_) => {
                let path = written(prefix);
                self.references.push(path.clone());
                self.modules[module].globs.push(path);
            }
            syn::UseTree::Group(g) => {
                for sub in &g.items {
                    self.read_use(sub, prefix.clone(), module);
                }
            }
        }
    }

    fn add_import(&mut self, module: ModuleId, name: String, path: WrittenPath) {
        self.references.push(path.clone());
        self.modules[module].imports.entry(name).or_insert(path);
    }
}

/// Collects every path written inside one item (not inside nested test-only items).
struct PathCollector<'a> {
    module: ModuleId,
    found: &'a mut Vec<WrittenPath>,
}

impl<'ast> Visit<'ast> for PathCollector<'_> {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.found.push(WrittenPath {
            module: self.module,
            segments,
            line: path.span().start().line,
        });
        syn::visit::visit_path(self, path);
    }

    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {
        // `pub(crate)`, `pub(in crate::x)`, `pub(super)` name where an item may be seen,
        // not something it uses.
    }

    fn visit_item(&mut self, item: &'ast syn::Item) {
        // Items nested in a function body: skip the test-only ones, read the rest.
        if !is_test_only(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs: &[syn::Attribute] = match item {
            syn::ImplItem::Const(c) => &c.attrs,
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Type(t) => &t.attrs,
            syn::ImplItem::Macro(m) => &m.attrs,
            _ => &[],
        };
        if !is_test_only(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }
}

/// The name an item defines in its module's namespace, if any.
fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::ExternCrate(i) => i.rename.as_ref().map(|(_, r)| r).unwrap_or(&i.ident),
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// `#[macro_export] macro_rules! name` lands at the crate root.
fn is_exported_macro(item: &syn::Item) -> bool {
    matches!(item, syn::Item::Macro(m) if m.attrs.iter().any(|a| a.path().is_ident("macro_export")))
}

/// True for `#[cfg(test)]` and `#[cfg(all(test, ...))]`: code that only tests compile.
pub fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        if !attr.path().is_ident("cfg") {
            return false;
        }
        let Ok(meta) = attr.parse_args::<syn::Meta>() else {
            return false;
        };
        cfg_requires_test(&meta)
    })
}

fn cfg_requires_test(meta: &syn::Meta) -> bool {
    match meta {
        syn::Meta::Path(p) => p.is_ident("test"),
        syn::Meta::List(list) if list.path.is_ident("all") => list
            .parse_args_with(syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated)
            .map(|parts| parts.iter().any(cfg_requires_test))
            .unwrap_or(false),
        _ => false,
    }
}

/// The file named by `#[path = "..."]`, if the declaration has one.
fn path_attribute(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|attr| {
        if !attr.path().is_ident("path") {
            return None;
        }
        match &attr.meta {
            syn::Meta::NameValue(nv) => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s), ..
                }) => Some(s.value()),
                _ => None,
            },
            _ => None,
        }
    })
}
