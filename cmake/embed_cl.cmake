# Turns the OpenCL source files into C arrays, with their names in order (the host joins them into one
# program, or with TLLM_CL_DIR reads the same names from disk):
#   cmake -DDIR=kernels/opencl -DFILES=a.cl,b.cl -DOUT=x.c -P embed_cl.cmake
string(REPLACE "," ";" FILES "${FILES}")
set(arrays "")
set(names "")
set(i 0)
foreach(f ${FILES})
  file(READ "${DIR}/${f}" hex HEX)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
  string(APPEND arrays "static const char source_${i}[] = {${body} 0x00}; /* ${f} */\n")
  string(APPEND names "\"${f}\", ")
  string(APPEND list "source_${i}, ")
  math(EXPR i "${i} + 1")
endforeach()
file(WRITE "${OUT}" "/* generated from ${DIR} */\n${arrays}
const char *const tllm_cl_sources[] = {${list}0};
const char *const tllm_cl_source_names[] = {${names}0};
const int tllm_cl_n_sources = ${i};
")
