#!/usr/bin/env bash
# template-only:file (a generated service does not carry its generator)
#
# Starts a new service from this template in one command:
#
#   scripts/new-service.sh NAME [DEST]
#
# copies the files git tracks here (so no target/) into DEST (default: NAME
# beside this checkout) and names everything after NAME: the binary, the
# environment prefix (ACME_EDGE_ for acme-edge), the metric prefix
# (acme_edge_), the default Redis key prefix (acme-edge:rl:) and ACL user,
# the crates' and README's wording. What only the template needs is left
# out: files marked `template-only:file` in their first lines and lines
# between `template-only:begin` and `template-only:end`. Then it checks that
# none of the template's names is left, and makes a first commit.
set -euo pipefail

# 20 characters at most: the tests' own Redis key prefixes add up to 44
# bytes to the service's within Redis's 64-byte key-prefix bound.
MAX_NAME=20
# The template's names, each at the start of a word or right after a \n, \r
# or \t escape (so `orca:rl:` is no leftover of `ca:rl:`, and "\r\nca:rl:"
# is one). Every rename below removes one of them.
LEFTOVER='(^|[^[:alnum:]]|\\[nrt])(ca-skeleton|ca_skeleton|ca:rl:|ca-rate-limit)|template-only:'

die() { printf 'new-service: %s\n' "$*" >&2; exit 1; }
usage() {
    printf 'usage: %s NAME [DEST]\n  NAME: lowercase kebab case starting with a letter, at most %s characters (e.g. acme-edge)\n  DEST: an empty or new directory (default: NAME beside this checkout)\n' \
        "$0" "$MAX_NAME" >&2
    exit 2
}

if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage; fi
name=$1
template=$(cd "$(dirname "$0")/.." && pwd -P)
dest=${2:-$(dirname "$template")/$name}

kebab='^[a-z][a-z0-9]*(-[a-z0-9]+)*$'
[[ $name =~ $kebab ]] || die "NAME '$name' is not lowercase kebab case (a letter first, then [a-z0-9] words joined by single '-'), e.g. acme-edge"
[ "${#name}" -le "$MAX_NAME" ] || die "NAME '$name' is ${#name} characters; at most $MAX_NAME"
snake=${name//-/_}
upper=$(printf '%s' "$snake" | tr '[:lower:]' '[:upper:]')
# A one-word NAME is also the snake-case identifier of a function and a crate.
keywords=" as async await break const continue crate dyn else enum extern false fn for gen if impl in let loop match mod move mut pub ref return self static struct super trait true try type unsafe use where while abstract become box do final macro override priv typeof unsized virtual yield "
case "$keywords" in
    *" $snake "*) die "NAME '$name' is a Rust keyword; pick another" ;;
esac
# The service reads every <PREFIX>_* variable as a configuration key, so
# the prefix must start no variable its own files name as a secret's
# source (RATE_LIMIT_ADMIN_TOKEN, REDIS_PASSWORD) nor one that toolchains,
# runtimes and locales set in every environment, nor one of a well-known
# family the service or its platform reads itself: OpenTelemetry's
# (OTEL_*), TLS roots (SSL_CERT_*), proxies (HTTP_PROXY, NO_PROXY, ...) and
# what Kubernetes sets in every pod.
template_vars=$(git -C "$(cd "$(dirname "$0")/.." && pwd -P)" grep -ohE 'env = "[A-Z][A-Z0-9_]*"' 2>/dev/null \
    | sed -E 's/env = "(.*)"/\1/' | sort -u || true)
for variable in $template_vars RUST_LOG CARGO_HOME LC_ALL TOKIO_WORKER_THREADS XDG_CONFIG_HOME \
    OTEL_SDK_DISABLED SSL_CERT_FILE HTTP_PROXY HTTPS_PROXY NO_PROXY ALL_PROXY KUBERNETES_SERVICE_HOST; do
    case "$variable" in
        "${upper}_"*) die "NAME '$name' gives the variable prefix ${upper}_, which would read $variable as a configuration key; pick another" ;;
    esac
done
for form in "$name" "$name:rl:" "$name-rate-limit"; do
    if printf '%s\n' "$form" | grep -Eiq "$LEFTOVER"; then
        die "NAME '$name' would keep a name of the template ('$form'); pick another"
    fi
done

git -C "$template" rev-parse --is-inside-work-tree >/dev/null 2>&1 \
    || die "$template is not a git checkout: the files to copy are the ones git tracks"
while IFS= read -r manifest; do
    package=$(awk '/^\[/ { section = $0 } section == "[package]" && /^name *=/ { print; exit }' "$template/$manifest")
    if [ "$package" = "name = \"$name\"" ]; then
        die "NAME '$name' is already a crate of the template ($manifest)"
    fi
done < <(git -C "$template" ls-files '*Cargo.toml')

if [ -e "$dest" ] && [ ! -d "$dest" ]; then
    die "DEST '$dest' exists and is not a directory"
fi
if [ -d "$dest" ] && [ -n "$(ls -A "$dest")" ]; then
    die "DEST '$dest' is not empty; give a new or empty directory"
fi
existed=false
if [ -d "$dest" ]; then existed=true; fi
mkdir -p "$dest"
dest=$(cd "$dest" && pwd -P)
case "$dest/" in
    "$template/"*)
        if ! $existed; then rmdir "$dest"; fi
        die "DEST '$dest' is inside the template's checkout; put it elsewhere" ;;
esac

# Every variant of the template's name, longest first.
rename_names() {
    NAME=$name SNAKE=$snake UPPER=$upper perl -pe '
        my $start = qr/(?:(?<![[:alnum:]])|(?<=\\[nrt]))/;
        s/${start}ca-skeleton-rs/$ENV{NAME}/g;
        s/${start}ca-skeleton/$ENV{NAME}/g;
        s/${start}CA_SKELETON/$ENV{UPPER}/g;
        s/${start}ca_skeleton/$ENV{SNAKE}/g;
        s/${start}ca:rl:/$ENV{NAME}:rl:/g;
        s/${start}ca-rate-limit/$ENV{NAME}-rate-limit/g;
    ' "$@"
}

copied=0
while IFS= read -r -d '' path; do
    source="$template/$path"
    # Tracked but deleted in the work tree: nothing to copy.
    [ -e "$source" ] || [ -L "$source" ] || continue
    # grep -c, not -q: it reads all of head's output, so head never dies of
    # a closed pipe (which pipefail would take for "not marked").
    if [ -f "$source" ] && [ ! -L "$source" ] && head -n 3 "$source" | grep -c 'template-only:file' >/dev/null; then
        continue
    fi
    target="$dest/$(printf '%s\n' "$path" | rename_names)"
    mkdir -p "$(dirname "$target")"
    if [ -L "$source" ] || ! grep -Iq . "$source" 2>/dev/null; then
        # Symlinks and binary (or empty) files as they are; the check below
        # names any that still holds a template name.
        cp -P -p "$source" "$target"
    else
        if grep -q 'template-only:begin' "$source"; then
            begins=$(grep -c 'template-only:begin' "$source")
            ends=$(grep -c 'template-only:end' "$source")
            [ "$begins" -eq "$ends" ] || die "$path: $begins template-only:begin but $ends template-only:end"
            # Blank lines around a cut block become at most one (none at the end).
            awk '
                /template-only:begin/ { skip = 1; next }
                skip { if (/template-only:end/) { skip = 0; cut = 1 } next }
                /^[[:space:]]*$/ { blanks = blanks $0 "\n"; count++; next }
                {
                    if (cut && count > 1) blanks = "\n"
                    printf "%s", blanks; print
                    blanks = ""; count = 0; cut = 0
                }
                END { if (!cut) printf "%s", blanks }
            ' "$source" | rename_names >"$target"
        else
            rename_names "$source" >"$target"
        fi
        chmod "$(if [ -x "$source" ]; then echo 755; else echo 644; fi)" "$target"
    fi
    copied=$((copied + 1))
done < <(git -C "$template" ls-files -z)

# The safety net: any template name left (in a file's text or its path)
# fails the generation, listing where.
leftovers=$(cd "$dest" && {
    grep -rnIE -i "$LEFTOVER" . || true
    { grep -rlaE -i "$LEFTOVER" . || true; } | while IFS= read -r file; do
        grep -Iq . "$file" || printf '%s: a binary file holding a template name\n' "$file"
    done
    { find . | grep -Ei "$LEFTOVER" || true; } | sed 's/$/: a path holding a template name/'
})
if [ -n "$leftovers" ]; then
    printf '%s\n' "$leftovers" >&2
    die "$dest still holds names of the template (above); rename them by hand or extend this script"
fi

git -C "$dest" init -q
git -C "$dest" add -A
if ! git -C "$dest" commit -q -m "$name: generated from the service template" 2>/dev/null; then
    echo "note: $dest is a git repository with everything staged, but not committed (git knows no author?)"
fi

echo "created $name in $dest ($copied files): binary $name, variables ${upper}_*, metrics ${snake}_*, Redis keys $name:rl:*"
echo "next: cd $dest && cargo test --workspace"
