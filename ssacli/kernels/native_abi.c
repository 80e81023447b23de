/* The layout of every kernel's argument struct (native_abi.h), which ssacli.kernels.native_abi reads
 * to build its ctypes structs: per struct its size, per field its name, offset, size, kind and, for a
 * pointer, the type of what it points at (the dtype a tensor given for it must have). All of it comes
 * from the same field lists as the structs themselves, so the struct layout is declared once, in
 * native_abi.h, and Python has no copy of it that could drift.
 */
#include <stddef.h>
#include <string.h>

#include "native_abi.h"

struct ssacli_field {
    const char *name;
    int64_t offset, size;
    char kind;           /* 'p' pointer, 'f' floating point, 'i' integer: what ctypes must declare */
    const char *element; /* a pointer's element type as torch names it ("float32", ...); "" otherwise */
};

/* GCC's and Clang's type classes (the sources already need one of them for vector extensions):
 * 5 pointer, 8 real; everything else our fields use (int, int64_t) is an integer. */
#define SSACLI_KIND(e) (__builtin_classify_type(e) == 5 ? 'p' : __builtin_classify_type(e) == 8 ? 'f' : 'i')
/* C11's _Generic names what a pointer field points at; void * (torch's sgemm) is an address, "". */
#define SSACLI_ELEMENT(e)                                                                             \
    _Generic((e), float *: "float32", const float *: "float32", double *: "float64",                  \
             const double *: "float64", int64_t *: "int64", const int64_t *: "int64",                 \
             uint8_t *: "uint8", const uint8_t *: "uint8", default: "")
#define SSACLI_ENTRY(S, type, name)                                                                   \
    {#name, (int64_t)offsetof(struct S, name), (int64_t)sizeof(((struct S *)0)->name),              \
     SSACLI_KIND(((struct S *)0)->name), SSACLI_ELEMENT(((struct S *)0)->name)},
#define SSACLI_TABLE(kernel, FIELDS) static const struct ssacli_field kernel##_fields[] = {FIELDS(SSACLI_ENTRY, kernel##_args)};
SSACLI_KERNELS(SSACLI_TABLE)

struct ssacli_layout {
    const char *kernel;
    int64_t size, count;
    const struct ssacli_field *fields;
};
#define SSACLI_LAYOUT(kernel, FIELDS)                                                                 \
    {#kernel, (int64_t)sizeof(struct kernel##_args),                                                  \
     (int64_t)(sizeof kernel##_fields / sizeof kernel##_fields[0]), kernel##_fields},
static const struct ssacli_layout layouts[] = {SSACLI_KERNELS(SSACLI_LAYOUT)};
#define N_LAYOUTS ((int64_t)(sizeof layouts / sizeof layouts[0]))

/* The name of kernel i (0, 1, ...), NULL past the last: Python checks it knows every one. */
const char *ssacli_abi_kernel(int64_t i) { return i >= 0 && i < N_LAYOUTS ? layouts[i].kernel : NULL; }

/* sizeof kernel's argument struct, its field count written to *count; -1 for an unknown kernel. */
int64_t ssacli_abi_size(const char *kernel, int64_t *count) {
    for (int64_t i = 0; i < N_LAYOUTS; i++)
        if (strcmp(layouts[i].kernel, kernel) == 0) {
            *count = layouts[i].count;
            return layouts[i].size;
        }
    return -1;
}

/* Field i of kernel's argument struct: its name, offset, size, kind and element type; returns 0, or
 * -1 where the kernel or the field does not exist (nothing written). */
int ssacli_abi_field(const char *kernel, int64_t i, const char **name, int64_t *offset, int64_t *size,
                     char *kind, const char **element) {
    for (int64_t j = 0; j < N_LAYOUTS; j++)
        if (strcmp(layouts[j].kernel, kernel) == 0) {
            if (i < 0 || i >= layouts[j].count) return -1;
            const struct ssacli_field *f = &layouts[j].fields[i];
            *name = f->name, *offset = f->offset, *size = f->size, *kind = f->kind, *element = f->element;
            return 0;
        }
    return -1;
}
