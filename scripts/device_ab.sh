#!/usr/bin/env bash
# scripts/device_ab.sh — an A/B of decode speed inside one device run: the
# working tree's moe against other commits built beside it, benches taken
# in turn so that every variant runs on the same card (H200s differ by up
# to 5% in read bandwidth, more than most changes are worth).
#
# Here, before the device call:
#   bash scripts/device_ab.sh pack NAME=COMMIT[+PATCH...] ...
# writes .carry/NAME.tar.gz (the commit's source, with the patch files named
# after it applied in order; git-ignored). Then on the
# device, with the tarballs carried (carry [".debs", ".carry"]):
#   MOE_EXPERIMENT='bash scripts/device_ab.sh run' bash scripts/device_run.sh
# builds each .carry/*.tar.gz beside the run's own build ($MOE) and prints, to
# experiment.log: tg128 twice per variant, tg32 at depth 4096 (or at each
# depth of MOE_AB_DEPTHS="1024 4096 ..."), and at
# positions 64 and 512 each stage's cost in the graph and the layer
# timeline (MOE_AB_TIMELINE=0 leaves those out, MOE_AB_TIMELINE="512"
# takes those positions). `bash scripts/device_ab.sh build` only builds
# them, as /tmp/ab-NAME-build/moe, for an experiment's own commands.
# MOE_AB_SASS=FILE.cu also brings back the SASS of that family file's
# kernels for every variant, as one $OUT/sass.tar.gz (a run returns at most
# eight files). MOE_AB_ENV="VAR=VAL ..." adds the run's own build under
# those variables as one more variant. MOE_AB_STAGING=1 adds `moe lab`'s
# staging rows of every build (the Q4_K lab, its staging table only; the
# run's own while the others compile).
# MOE_AB_TESTS=1 also builds each packed variant's GPU kernel test and
# runs it after the benches (its last lines in experiment.log): a variant
# that wins has been checked against the CPU in the same run.
# MOE_AB_PREFILL=1 adds
# pp512 (with its phases) and pp2048 of every variant. MOE_AB_NCU=REGEX runs
# Nsight Compute (--set full) on one launch of the run's own build whose
# kernel matches, in the decode step at depth 512 without the graph, into
# $OUT/ncu_ab.txt and the per-instruction counts and stalls $OUT/ncu_ab_sass.csv.
set -u
shopt -s nullglob
cd "$(dirname "$0")/.." || exit 1

pack() {
    mkdir -p .carry
    rm -f .carry/*.tar .carry/*.tar.gz # only the variants named now are built on the device
    for spec in "$@"; do
        local name=${spec%%=*} rev=${spec#*=}
        local commit=${rev%%+*} patches=()
        [ "$rev" = "$commit" ] || IFS=+ read -r -a patches <<<"${rev#*+}"
        [ ${#patches[@]} -eq 0 ] || commit=$(commit_with_patches "$commit" "${patches[@]}") || exit 1
        # compressed: the working tree and the carried paths travel within 64 MiB
        git archive --format=tar.gz "$commit" -- . ':!models' ':!data' ':!tests/fixtures' ':!tests/golden/fixtures' \
            >".carry/$name.tar.gz" || exit 1
        echo ".carry/$name.tar.gz: $(git log --oneline -1 "$commit")"
    done
}

# commit_with_patches COMMIT PATCH...: a dangling commit of COMMIT with the
# patches applied (a scratch worktree, removed again); prints its hash.
commit_with_patches() {
    local base=$1 tree top hash=""
    shift
    tree=$(mktemp -d)
    top=$(pwd)
    git worktree add -q --detach "$tree" "$base" || return 1
    if (cd "$tree" && for p in "$@"; do git apply "$top/$p" || exit 1; done && git add -A &&
        git -c user.name=device_ab -c user.email=device_ab@localhost commit -q -m "$base + $*"); then
        hash=$(git -C "$tree" rev-parse HEAD)
    else
        echo "device_ab: a patch of $* does not apply to $base" >&2
    fi
    git worktree remove --force "$tree"
    [ -n "$hash" ] && echo "$hash"
}

build_variants() {
    # device_run.sh starts one in the background: the second waits for it
    # and finds its builds up to date
    exec 9>/tmp/ab-build.lock
    flock 9
    local prefix=/tmp/moe-prefix/usr targets=moe
    [ "${MOE_AB_TESTS:-0}" = 1 ] && targets="moe test_cuda_kernels"
    for tarball in .carry/*.tar.gz; do
        local name
        name=$(basename "$tarball" .tar.gz)
        mkdir -p "/tmp/ab-$name" && tar -xf "$tarball" -C "/tmp/ab-$name" &&
            cmake -S "/tmp/ab-$name" -B "/tmp/ab-$name-build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_CUDA=ON \
                -DMOE_BENCH=OFF -DCMAKE_PREFIX_PATH=$prefix -DCMAKE_LIBRARY_PATH=$prefix/lib/x86_64-linux-gnu \
                >"/tmp/ab-$name.log" 2>&1 &&
            cmake --build "/tmp/ab-$name-build" -j"$(nproc)" --target $targets >>"/tmp/ab-$name.log" 2>&1
        echo "$name: $(tail -1 "/tmp/ab-$name.log")"
    done
}

# The variants, a command each: the run's own build, with MOE_AB_ENV="VAR=VAL
# ..." that build again under those variables (a switch's two sides in one
# binary), then every packed build.
variants() {
    echo "$MOE"
    [ -n "${MOE_AB_ENV:-}" ] && echo "env $MOE_AB_ENV $MOE"
    local moe
    for moe in /tmp/ab-*-build/moe; do [ -x "$moe" ] && echo "$moe"; done
    return 0
}

# Each packed variant's GPU kernel test (MOE_AB_TESTS=1): its summary lines.
kernel_tests() {
    local build
    for build in /tmp/ab-*-build; do
        [ -x "$build/tests/test_cuda_kernels" ] || continue
        echo "== kernel test $build"
        timeout 60 "$build/tests/test_cuda_kernels" >/tmp/ab-kernels.log 2>&1
        echo "exit $?"
        grep -E "^ *(ok |FAIL)|[0-9]+ passed" /tmp/ab-kernels.log
    done
}

# bench LABEL ARGS...: one line per variant, the run's own build first
# (the decode row, or with -n 0 the prefill's)
bench() {
    local label=$1
    shift
    local moe
    while read -r moe; do
        echo "== $label $moe"
        $moe bench -m "$MODEL" --device cuda "$@" 2>&1 | grep -E "graph\+PDL|\| pp[0-9]+ "
    done < <(variants)
}

timeline() {
    local moe
    while read -r moe; do
        echo "== timeline at $1 $moe"
        # each stage's cost in the graph (us a token), then the layer's launches
        $moe bench -m "$MODEL" -p 0 -n 16 -r 1 --device cuda --profile="$1" 2>&1 |
            awk -F'|' '/decode step by stage/{s=1} /inside the graph/{s=2}
                s==1 && /^\| [a-z*]/ && $2 !~ /stage/{printf "|%s| in graph %s us/token |\n", $2, $(NF-2)}
                s==2 && /^\| [a-z]/'
    done < <(variants)
}

# pp512 and pp2048 of every variant, and where pp512's time goes (the
# prefill's phases, from builds that have them).
prefill() {
    bench pp2048 -p 2048 -n 0 -r 2
    local moe
    while read -r moe; do
        echo "== pp512 $moe"
        $moe bench -m "$MODEL" --device cuda -p 512 -n 0 -r 3 --profile --profile-reps 1 >/tmp/ab-pp.log 2>&1
        grep "| pp512 " /tmp/ab-pp.log
        sed -n '/^### batched prefill/,/^| \*\*prompt/p' /tmp/ab-pp.log
    done < <(variants)
}

# The SASS of src/cuda/$1's kernels in each variant's build, into $OUT/sass.tar.gz.
sass() {
    local dir=/tmp/ab-sass object=CMakeFiles/moecore.dir/src/cuda/$1.o
    mkdir -p "$dir"
    cuobjdump -sass "$(dirname "$MOE")/$object" >"$dir/sass-main.txt" 2>&1
    for build in /tmp/ab-*-build; do
        [ -d "$build" ] || continue
        local name=${build#/tmp/ab-}
        cuobjdump -sass "$build/$object" >"$dir/sass-${name%-build}.txt" 2>&1
    done
    tar -czf "${OUT:?}/sass.tar.gz" -C "$dir" .
    echo "== SASS of $1: $(ls "$dir" | tr '\n' ' ')-> \$OUT/sass.tar.gz"
}

# The staging rows of `moe lab` for build $1 (the lab picks its ways
# itself: MOE_AB_ENV's variant would repeat its build's rows).
staging_rows() {
    echo "== staging $1"
    "$1" lab --type q4_k -r 20 2>&1 | sed -n "/^### Staging/,/^Staging rows/p; /error\|fail/Ip" | grep -iE "^\| [a-z]|error|fail"
}

# Nsight Compute on launch 150 of the kernels matching $1 (the 4th token's
# at 48 launches a token): the whole profile and its SASS page.
ncu_kernel() {
    env MOE_CUDA_GRAPH=0 timeout 150 ncu --clock-control none --cache-control none -k "regex:$1" --launch-skip 150 \
        --launch-count 1 --set full -f -o /tmp/ab-ncu "$MOE" bench -m "$MODEL" -p 0 -n 4 -r 1 -d 512 --device cuda \
        >/tmp/ab-ncu.log 2>&1
    echo "== ncu $1: exit $?"
    ncu -i /tmp/ab-ncu.ncu-rep --page details --print-details all >"${OUT:?}/ncu_ab.txt" 2>&1
    ncu -i /tmp/ab-ncu.ncu-rep --page source --csv --print-source sass >"$OUT/ncu_ab_sass.csv" 2>&1
}

run() {
    : "${MOE:?set by device_run.sh}" "${MODEL:?set by device_run.sh}"
    local staging=${MOE_AB_STAGING:-0} moe
    build_variants >/tmp/ab-build.log 2>&1 &
    local builder=$!
    # the run's own staging rows while the variants compile (the lab times on the GPU's clock)
    [ "$staging" = 1 ] && staging_rows "$MOE"
    wait "$builder"
    cat /tmp/ab-build.log
    [ -n "${MOE_AB_SASS:-}" ] && sass "$MOE_AB_SASS"
    if [ "$staging" = 1 ]; then
        for moe in /tmp/ab-*-build/moe; do [ -x "$moe" ] && staging_rows "$moe"; done
    fi
    bench tg128 -p 0 -n 128 -r 5
    bench tg128 -p 0 -n 128 -r 5
    local depth
    for depth in ${MOE_AB_DEPTHS:-4096}; do bench "d$depth" -p 0 -n 32 -r 2 -d "$depth"; done
    [ "${MOE_AB_PREFILL:-0}" = 1 ] && prefill
    local positions=${MOE_AB_TIMELINE:-1}
    [ "$positions" = 1 ] && positions="64 512"
    [ "$positions" = 0 ] && positions=""
    for pos in $positions; do timeline "$pos"; done
    [ -n "${MOE_AB_NCU:-}" ] && ncu_kernel "$MOE_AB_NCU"
    [ "${MOE_AB_TESTS:-0}" = 1 ] && kernel_tests
    return 0
}

# The comment at the top of this file, without its "# " (no line count to
# keep up to date as it grows).
usage() { awk 'NR == 1 { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "$0"; }

case "${1:-}" in
pack) shift && pack "$@" ;;
run) run ;;
build) build_variants ;; # only the variants' builds, for an experiment's own commands
-h | --help) usage ;;
*)
    usage >&2
    exit 2
    ;;
esac
