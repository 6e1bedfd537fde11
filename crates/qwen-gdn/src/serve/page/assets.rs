//! The page's files, compiled in, with their paths and content types. Every file that
//! index.html or a script refers to must be listed here (a test reads them for references).

pub struct Asset {
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static str,
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const SVG: &str = "image/svg+xml";

macro_rules! asset {
    ($path:literal, $file:literal, $type:expr) => {
        Asset {
            path: $path,
            content_type: $type,
            body: include_str!(concat!("files/", $file)),
        }
    };
}

pub static ALL: &[Asset] = &[
    asset!("/", "index.html", HTML),
    asset!("/page/style.css", "style.css", CSS),
    asset!("/page/icon.svg", "icon.svg", SVG),
    asset!("/page/app.js", "app.js", JS),
    asset!("/page/store.js", "store.js", JS),
    asset!("/page/request.js", "request.js", JS),
    asset!("/page/stream.js", "stream.js", JS),
    asset!("/page/view.js", "view.js", JS),
];

#[cfg(test)]
mod tests {
    use super::ALL;

    /// The paths a file refers to: `src=`/`href=` in index.html (relative to `/`), `from
    /// "./x.js"` in a script (relative to `/page/`).
    fn references(asset: &super::Asset) -> Vec<String> {
        let mut found = Vec::new();
        for (marker, base) in [("src=\"", "/"), ("href=\"", "/"), ("from \"./", "/page/")] {
            for (at, _) in asset.body.match_indices(marker) {
                let rest = &asset.body[at + marker.len()..];
                found.push(format!("{base}{}", &rest[..rest.find('"').unwrap()]));
            }
        }
        found
    }

    #[test]
    fn every_reference_is_served_and_every_file_is_used() {
        let mut used = vec!["/".to_string()];
        for asset in ALL {
            for target in references(asset) {
                assert!(
                    ALL.iter().any(|a| a.path == target),
                    "{} refers to {target}, which is not served",
                    asset.path
                );
                used.push(target);
            }
        }
        for asset in ALL {
            assert!(
                used.contains(&asset.path.to_string()),
                "{} is unused",
                asset.path
            );
        }
    }

    #[test]
    fn the_stylesheet_loads_nothing() {
        let css = ALL.iter().find(|a| a.content_type == super::CSS).unwrap();
        for needle in ["url(", "@import"] {
            assert!(!css.body.contains(needle), "{} has {needle}", css.path);
        }
    }
}
