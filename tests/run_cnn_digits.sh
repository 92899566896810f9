#!/bin/sh
# run_cnn_digits.sh synthetic CNN_DIGITS | digits CNN_DIGITS MLP_CSV: the cnn_digits example learns.
# synthetic: 4 epochs on the synthetic set (said so in the output) reach 60% test accuracy (chance is
# 10%; seeds 1-6 gave 79-89%), and a CSV row of the wrong length is an error naming file and line.
# digits: 4 epochs on python3-sklearn's digits reach 93% (seeds 1-6 gave 96.4-98.9%), and the default
# run (15 epochs) is at least as accurate as mlp_csv's default run on the same split (99.16% and
# 98.33% with seed 1); skipped (77) when the file is absent or the build has no zlib.
set -eu
mode=$1 cnn=$2 tmp=${TMPDIR:-/tmp}/cnn_digits_test.$$
trap 'rm -f "$tmp".*' EXIT
digits=/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz

# check OUTPUT EPOCHS MIN: every epoch line there, in order, and the final accuracy >= MIN.
check() {
    awk -v epochs="$2" -v min="$3" '
        /^epoch / { n++; if ($2 != n || $3 != "loss" || $5 != "test_accuracy" || $7 != "scale" || $9 != "skipped" || NF != 10) {
                        print "bad epoch line: " $0; bad = 1 } }
        /^test_accuracy / { acc = $2; seen = 1 }
        END {
            if (bad) exit 1
            if (n != epochs) { print "expected " epochs " epoch lines, found " n; exit 1 }
            if (!seen) { print "no final test_accuracy line"; exit 1 }
            if (!(acc >= min)) { print "test accuracy " acc " is below " min; exit 1 }
            print "test accuracy " acc " (at least " min ")"
        }' "$1"
}

case $mode in
synthetic)
    "$cnn" --synthetic --epochs 4 >"$tmp.out"
    cat "$tmp.out"
    grep -q 'SYNTHETIC digits' "$tmp.out" || { echo "the output does not say the data is synthetic"; exit 1; }
    check "$tmp.out" 4 0.6
    printf '1,2,3\n' >"$tmp.csv"
    if "$cnn" --data "$tmp.csv" --epochs 1 2>"$tmp.err"; then echo "a 3-field row was accepted"; exit 1; fi
    grep -q "$tmp.csv:1: expected 65 fields (64 pixels and a label), found 3" "$tmp.err" ||
        { echo "unexpected message:"; cat "$tmp.err"; exit 1; }
    ;;
digits)
    mlp=$3
    if [ ! -r "$digits" ]; then
        echo "SKIP: $digits is absent (Debian: apt-get install python3-sklearn)"
        exit 77
    fi
    "$cnn" --epochs 4 >"$tmp.out"
    cat "$tmp.out"
    if grep -q 'this build has no zlib' "$tmp.out"; then
        echo "SKIP: cnn_digits was built without zlib and cannot read $digits"
        exit 77
    fi
    grep -q "^data $digits: 1797 images" "$tmp.out" || { echo "the run did not read $digits"; exit 1; }
    check "$tmp.out" 4 0.93
    # the comparison the issue asks for: the CNN against the MLP on the same split (seed 1, 20% test)
    "$cnn" >"$tmp.cnn"
    gzip -dc "$digits" >"$tmp.csv"
    "$mlp" --csv "$tmp.csv" >"$tmp.mlp"
    cnn_acc=$(sed -n 's/^test_accuracy //p' "$tmp.cnn") mlp_acc=$(sed -n 's/^test_accuracy //p' "$tmp.mlp")
    echo "cnn_digits test_accuracy $cnn_acc, mlp_csv test_accuracy $mlp_acc"
    awk -v c="$cnn_acc" -v m="$mlp_acc" 'BEGIN { if (!(c + 0 >= m + 0 && m + 0 > 0.9)) { print "the CNN is not at least as accurate as the MLP"; exit 1 } }'
    ;;
*)
    echo "usage: run_cnn_digits.sh synthetic CNN_DIGITS | digits CNN_DIGITS MLP_CSV"
    exit 2
    ;;
esac
