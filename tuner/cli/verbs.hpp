// The verbs of the flashtune command line, one file each (tuner/cli/<verb>.cpp); main.cpp dispatches.
// Each takes main's argc/argv (argv[1] is the verb), returns the exit status, and throws UsageError on
// bad input (main prints it and exits 2).
#pragma once

namespace flashtune::cli {

int cmd_devices(int argc, char** argv);  // devices
int cmd_families(int argc, char** argv);  // families
int cmd_problems(int argc, char** argv);  // problems
int cmd_compile_check(int argc, char** argv);  // compile-check
int cmd_tune(int argc, char** argv);  // tune
int cmd_run(int argc, char** argv);  // run
int cmd_best(int argc, char** argv);  // best
int cmd_emit(int argc, char** argv);  // emit
int cmd_report(int argc, char** argv);  // report
int cmd_experiment(int argc, char** argv);  // experiment
int cmd_drop_cubins(int argc, char** argv);  // drop-cubins
int cmd_merge(int argc, char** argv);  // merge
int cmd_export(int argc, char** argv);  // export
int cmd_import(int argc, char** argv);  // import

}  // namespace flashtune::cli
