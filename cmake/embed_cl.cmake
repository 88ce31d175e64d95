# Turns an OpenCL source file into a C array: cmake -DIN=x.cl -DOUT=x.c -DNAME=sym -P embed_cl.cmake
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
file(WRITE "${OUT}" "/* generated from ${IN} */\nconst char ${NAME}[] = {${body} 0x00};\n")
