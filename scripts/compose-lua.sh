# Sourced by the bench scripts: compose <dir> <driver> <algorithm file> <function>
# prints a driver script with its include lines filled in, as
# adapter-redis/src/scripts.rs composes it (the algorithm's file at the
# `algorithm.lua` line, followed by the line binding `algorithm`).
compose() {
    awk -v dir="$1" -v alg="$3" -v fn="$4" '
        /^-- #include algorithm.lua/ {f=dir"/"alg; while ((getline l < f) > 0) print l; close(f)
                                      print "local algorithm = " fn; next}
        /^-- #include / {f=dir"/"$3; while ((getline l < f) > 0) print l; close(f); next}
        {print}' "$1/$2"
}
