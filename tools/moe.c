/*
 * moe.c — the `moe` program: one binary, one subcommand per job.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"chat", cmd_chat, "an interactive conversation using the chat template"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server"},
    {"tokenize", cmd_tokenize, "print the tokens of a text"},
    {"logits", cmd_logits, "logits of every position of a token sequence (teacher-forced)"},
    {"perplexity", cmd_perplexity, "perplexity of a model on a text file"},
    {"inspect", cmd_inspect, "show a GGUF file's metadata, tensors and architecture"},
    {"quantize", cmd_quantize, "re-quantize a GGUF model (q4_k_m, q8_0, ...)"},
    {"convert", cmd_convert, "convert a Hugging Face checkpoint (safetensors) to GGUF"},
    {"synth", cmd_synth, "write a model with random weights at real shapes"},
    {"bench", cmd_bench, "prompt and generation speed beside the measured ceilings"},
    {"lab", cmd_lab, "the GPU kernels on real shapes beside a pure read of their bytes"},
};

static void print_usage(FILE *out) {
    fprintf(out, "moe %s: run Mixture-of-Experts language models from GGUF files\n\n", MOE_VERSION_STRING);
    fprintf(out, "usage: moe <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\nRun 'moe <command> --help' for a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        print_usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        print_usage(stdout);
        return 0;
    }
    if (strcmp(name, "--version") == 0) {
        printf("moe %s\n", MOE_VERSION_STRING);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(name, commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "moe: unknown command '%s'\n\n", name);
    print_usage(stderr);
    return 2;
}
