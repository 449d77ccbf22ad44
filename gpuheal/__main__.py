from gpuheal.entry import main

main()
